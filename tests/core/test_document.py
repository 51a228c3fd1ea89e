"""One check's feedback, kept as blocks and rendered per reader: Gradescope's Markdown, a
terminal's plain text, a report's HTML, the student's text escaped exactly once in each."""

from __future__ import annotations

import json

from grader.core.document import counted, to_html, to_markdown, to_text, unescape
from grader.core.feedback import (
    FEEDBACK,
    blocks_of,
    check_html,
    check_text,
    escape,
    markdown_results,
    page_text,
    shorten_arrays,
)
from grader.core.feedback_items import ITEMS, Case, Feedback
from grader.core.results import GradingResults, TestResult
from grader.core.terminal import terminal_report

#: What a student's code can make a message say: HTML, Markdown, a long list of numbers.
RAISED = "forward raised NameError: <module> has no *x* [link](http://e)"
#: What check 2.2 hands over for two failing cases of ten, and what the submission printed.
ITEMS_22 = Feedback(
    count="0 of 10 cases correct.",
    cases=[
        Case("case 1 (8 tokens)", RAISED),
        Case("f(8B)", "[8, 9, 10, 11, 12, 13]", "compared exactly"),
    ],
    more=8,
    printed="hello <b>",
    ended=True,
)
OUTPUT = f"{ITEMS_22.count}\n\n{ITEMS_22.text()}"


def failed(output: str = OUTPUT, max_score: float = 1) -> TestResult:
    """Check 2.2 failed: with the items above, or, given another ``output``, with that
    plain text only."""
    extra = {ITEMS: ITEMS_22.to_json()} if output == OUTPUT else {}
    return TestResult(
        "2.2 logits", 0, max_score, "failed", "2.2", output, ["part2"], extra_data=extra
    )


def stored(test: TestResult) -> dict:
    """The check as a results file holds it, read back."""
    data = markdown_results(GradingResults(tests=[test])).to_gradescope()
    return json.loads(json.dumps(data))["tests"][0]


def test_markdown_is_what_gradescope_shows_and_the_blocks_ride_along() -> None:
    entry = stored(failed())
    assert entry["output"] == to_markdown(entry["extra_data"][FEEDBACK])
    assert entry["output"].startswith("**Failed: 0 / 1 point.** 0 of 10 cases correct.")
    assert escape(RAISED) in entry["output"]


def test_the_terminal_reads_plain_text_without_marks_or_escapes() -> None:
    for check in (failed(), stored(failed())):  # a live grading and a file read back
        text = check_text(check, {})
        assert text.startswith("Failed: 0 / 1 point. 0 of 10 cases correct.\n"), text
        assert RAISED in text and "hello <b>" in text
        for mark in ("**", "\\[", "&lt;", "&amp;", "| case |", "```"):
            assert mark not in text, (mark, text)
        assert "\n(and 8 more failing cases)\n" in text


def test_html_escapes_the_students_text_exactly_once() -> None:
    for check in (failed(), stored(failed())):
        page = check_html(check, {})
        assert "&lt;module&gt; has no *x* [link](http://e)" in page
        assert "&amp;lt;" not in page and "\\" not in page and "**" not in page
        assert "<table>" in page and "<pre>hello &lt;b&gt;</pre>" in page
        assert "<strong>Failed: 0 / 1 point.</strong>" in page


def test_run_locally_the_advice_never_says_to_run_what_was_just_run() -> None:
    blank = failed("It raised NotImplementedError.")
    assert "python selfcheck.py --parts 2" in check_text(blank, {})  # as Gradescope says
    assert "selfcheck.py" not in check_text(blank, {}, local=True)
    assert "selfcheck.py" not in check_html(blank, {}, local=True)
    cases = check_text(failed(), {}, local=True)
    assert cases.endswith("Try: start with the first case in the table.")


def test_a_long_list_of_counts_is_cut_to_its_largest_not_its_magnitude() -> None:
    counts = shorten_arrays("lengths [1, 5, 15, 3, 2, 7]")
    assert counts == "lengths [1, 5, 15, 3, ... (6 values, the largest 15)]"


def test_a_file_written_before_the_blocks_were_kept_still_reads_as_text() -> None:
    entry = stored(failed())
    del entry["extra_data"][FEEDBACK]
    text = to_text(blocks_of(entry, {}))
    assert "Failed: 0 / 1 point." in text and "<module>" in text and "**" not in text
    assert "&lt;module&gt;" in to_html(blocks_of(entry, {}))
    assert "&amp;lt;" not in to_html(blocks_of(entry, {}))


def test_the_page_summary_reads_back_as_the_text_it_was() -> None:
    text = "part1 (calculator): 0 / 2\n\nimport failed: <module> *x* \\ 1. [a]"
    data = markdown_results(GradingResults(output=text)).to_gradescope()
    assert page_text(data["output"], "md") == text
    assert unescape(escape("<a> \\. *b*")) == "<a> \\. *b*"


def test_show_prints_a_stored_file_as_text() -> None:
    data = markdown_results(GradingResults(tests=[failed()])).to_gradescope()
    shown = terminal_report(GradingResults.from_gradescope(data), details=True)
    assert "**" not in shown and "&lt;" not in shown and RAISED in shown


def test_a_count_of_one_takes_the_singular() -> None:
    assert counted(1, "prompt") == "1 prompt"
    assert [counted(n, "prompt") for n in (0, 2, 16)] == ["0 prompts", "2 prompts", "16 prompts"]
