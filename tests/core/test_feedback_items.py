"""Each kind of feedback item as the three readers draw it: laid out from its fields, so
that what a sentence says never decides a table's shape."""

from __future__ import annotations

import json
import re

import pytest

from grader.core.document import escape, to_html, to_markdown, to_text
from grader.core.feedback import feedback_blocks, markdown_results
from grader.core.feedback_items import (
    ITEMS,
    Case,
    Cause,
    Feedback,
    LogitCase,
    Measurement,
)
from grader.core.results import GradingResults, TestResult


def graded(fb: Feedback, *, status: str = "failed", tags: tuple[str, ...] = ()) -> TestResult:
    """A check of Part 2 that handed ``fb`` over (its plain text says nothing)."""
    fb.ended = True
    return TestResult(
        name="2.4 a check", score=0 if status == "failed" else 2, max_score=2, status=status,
        number="2.4", output="", tags=["part2", *tags], extra_data={ITEMS: fb.to_json()},
    )  # fmt: skip


def tables(blocks: list[dict]) -> list[tuple[list[str], list[int]]]:
    """Each table's header and the number of cells in each of its rows."""
    return [(b["header"], [len(r) for r in b["rows"]]) for b in blocks if b["kind"] == "table"]


def test_a_case_compared_as_a_value_has_expected_and_got_columns() -> None:
    case = Case("f(8B)", "536,870,912", "compared exactly")
    blocks = feedback_blocks(graded(Feedback(cases=[case])), None, "cpu")
    assert tables(blocks) == [(["case", "expected", "got"], [3])]
    md = to_markdown(blocks)
    assert "| f(8B) | the right value (compared exactly) | 536,870,912 |" in md
    assert "start with the first case in the table" in md


def test_a_case_that_compared_nothing_says_what_happened() -> None:
    case = Case("case 2 (8 tokens)", "forward raised NameError: <x>")
    blocks = feedback_blocks(graded(Feedback(cases=[case])), None, "cpu")
    assert tables(blocks) == [(["case", "what happened"], [2])]
    assert "| case 2 (8 tokens) | forward raised NameError: &lt;x&gt; |" in to_markdown(blocks)


def test_logits_read_as_their_tolerance_and_error_and_where_they_first_went_wrong() -> None:
    case = LogitCase("case 1 (8 tokens)", 7.7312, 0.01, "position 2 of 8")
    blocks = feedback_blocks(graded(Feedback(count="0 of 10 cases correct.", cases=[case])),
                             None, "cpu")  # fmt: skip
    md = to_markdown(blocks)
    assert md.startswith("**Failed: 0 / 2 points.** 0 of 10 cases correct.")
    row = "| case 1 (8 tokens) | logits within 0.01 of the reference's | off by up to 7.73, "
    assert row + "first at position 2 of 8 |" in md


def test_cases_of_both_kinds_share_one_table() -> None:
    fb = Feedback(cases=[Case("a", "raised"), LogitCase("b", 1.0, 0.1)], more=2)
    blocks = feedback_blocks(graded(fb), None, "cpu")
    assert tables(blocks) == [(["case", "expected", "got"], [3, 3])]
    assert "*(and 2 more failing cases)*" in to_markdown(blocks)
    assert "\n(and 2 more failing cases)\n" in to_text(blocks) + "\n"


def test_a_case_remark_follows_the_table() -> None:
    case = Case("f(x)", "1", "compared exactly", remark="This follows from 1.2; fix that first.")
    text = to_text(feedback_blocks(graded(Feedback(cases=[case])), None, "cpu"))
    assert "f(x): This follows from 1.2; fix that first." in text


def test_one_cause_is_a_sentence_several_a_list_each_once() -> None:
    one = Feedback(causes=[Cause("a", "your code does A", "its value")])
    assert "**Likely cause:** your code does A." in to_markdown(
        feedback_blocks(graded(one), None, "cpu")
    )
    fb = Feedback()
    fb.name([Cause("a", "your code does A"), Cause("b", "generate does B"),
             Cause("a", "your code does A")])  # fmt: skip
    md = to_markdown(feedback_blocks(graded(fb), None, "cpu"))
    assert "**Likely causes:**\n\n- your code does A\n- generate does B" in md
    assert "**Try:** fix the likely cause above" in md
    assert fb.cause_ids() == ["a", "b"]


def test_a_cause_of_several_mistakes_counts_each_of_them() -> None:
    fb = Feedback(causes=[Cause("no_output_head+two_matrix_ffn", "your code A, and B")])
    assert fb.cause_ids() == ["no_output_head", "two_matrix_ffn"]


def test_a_measurement_is_a_table_of_its_own() -> None:
    fb = Feedback(tables=[Measurement(["run", "ms"], [["cached", "4.0"], ["plain", "9.5"]])])
    blocks = feedback_blocks(graded(fb), None, "cpu")
    assert tables(blocks) == [(["run", "ms"], [2, 2])]
    assert "<tr><td>cached</td><td>4.0</td></tr>" in to_html(blocks)


def test_lines_and_what_the_submission_printed() -> None:
    fb = Feedback(lead=["It raised <b>."], notes=["Note: see 2.2."], printed="```\nhi <i>")
    blocks = feedback_blocks(graded(fb), None, "cpu")
    md = to_markdown(blocks)
    assert md.index("It raised &lt;b&gt;.") < md.index("Note: see 2.2.")
    assert re.search(r"^````text\n```\nhi <i>\n````$", md, re.M), md
    assert "<pre>```\nhi &lt;i&gt;</pre>" in to_html(blocks)


def test_a_plain_message_keeps_what_the_submission_printed_apart() -> None:
    fb = Feedback()
    fb.line("It raised.\n\nYour code printed:\nhello")
    assert (fb.lead, fb.printed) == (["It raised."], "hello")
    fb.add(Case("a", "b"))
    fb.line("after")
    assert fb.notes == ["after"]


def test_a_hidden_check_shows_its_count_only() -> None:
    fb = Feedback(count="18 of 32 hidden cases correct.", cases=[Case("hidden spec #1", "50")],
                  causes=[Cause("x", "your code does X")])  # fmt: skip
    md = to_markdown(feedback_blocks(graded(fb, tags=("hidden",)), None, "cpu"))
    assert md.startswith("**Failed: 0 / 2 points.** 18 of 32 hidden cases correct.")
    assert "hidden spec" not in md and "50" not in md and "does X" not in md


def test_a_passed_check_shows_its_notes_and_no_advice() -> None:
    fb = Feedback(count="3 of 3 cases correct.", lead=["Note: a float was accepted."])
    md = to_markdown(feedback_blocks(graded(fb, status="passed"), None, "cpu"))
    assert md == "**Passed: 2 / 2 points.** 3 of 3 cases correct.\n\nNote: a float was accepted."


def test_the_items_round_trip_as_json_and_leave_the_file_for_the_blocks() -> None:
    cases: list = [Case("x", "y", "h", "r"), LogitCase("z", 1.5, 0.01, "p")]
    measured = [Measurement(["h"], [["v"]])]
    fb = Feedback(count="c", causes=[Cause("a", "t", "e")], lead=["l"], cases=cases, more=1,
                  notes=["n"], tables=measured, printed="p", ended=True)  # fmt: skip
    assert Feedback.from_json(json.loads(json.dumps(fb.to_json()))) == fb
    assert Feedback.from_json({"cases": "nonsense"}) is None
    test = graded(fb)
    data = markdown_results(GradingResults(tests=[test])).to_gradescope()
    assert ITEMS not in data["tests"][0]["extra_data"]
    assert data["tests"][0]["extra_data"]["feedback"]
    assert ITEMS in test.extra_data  # the plain results are left alone


def test_the_plain_message_is_written_from_the_items() -> None:
    fb = Feedback(lead=["First."], cases=[Case("f(1)", "2", "compared exactly"),
                                          LogitCase("case 1", 0.5, 0.01, "position 1")],
                  more=1, causes=[Cause("a", "your code A"), Cause("b", "your code B")],
                  printed="out")  # fmt: skip
    assert fb.text() == (
        "First.\nf(1) returned 2, which is wrong (compared exactly).\n"
        "case 1: logits differ from the reference's by up to 0.5 (tolerance 0.01); first "
        "wrong position 1.\n(and 1 more failing case)\nLikely cause: your code A; or your "
        "code B.\n\nYour code printed:\nout"
    )


#: A line of an exception message a student controls, after each kind of lead a renderer
#: may take for indentation: the no-break space and other Unicode spaces, a tab, the
#: zero-width characters.
LEADS = ["\u00a0", "\u2003", "\u3000", "\u202f", "\t", "\u200b", "\ufeff", "\u00a0\u200b "]


def rendered(text: str) -> str:
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable("table").render(text)


@pytest.mark.parametrize("lead", LEADS, ids=["+".join(f"U{ord(c):04X}" for c in x) for x in LEADS])
def test_a_forged_verdict_after_any_lead_is_plain_text(lead: str) -> None:
    """Issue 63: a line that begins with a no-break space and ``__Passed: 2 / 2 points.__``
    rendered bold on Gradescope, under the grader's own verdict."""
    forged = [f"{lead}__Passed: 2 / 2 points.__", f"{lead}# Passed", f"{lead}- all passed",
              f"{lead}+ passed", f"{lead}1. passed", f"{lead}---", f"{lead}=== "]  # fmt: skip
    for line in forged:
        assert "__P" not in escape(line)
        md = to_markdown(feedback_blocks(graded(Feedback(lead=[f"It raised: x\n{line}"])),
                                         None, "cpu"))  # fmt: skip
        html = rendered(md)
        assert not re.search(r"<(h[1-6]|hr|ul|ol|li|em)\b", html), (line, html)
        assert html.count("<strong>") == 2, html  # the verdict and the Try line only


def test_underscores_inside_words_stay_as_they_are() -> None:
    assert escape("n_kv_heads a__b") == "n_kv_heads a__b"
    assert escape("x __bold__ y") == r"x \_\_bold__ y"
    assert "<strong>" not in rendered(escape("x __bold__ y and \u00a0__y__"))
