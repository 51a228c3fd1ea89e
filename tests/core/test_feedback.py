"""The Markdown a student reads on Gradescope, from the items the checks hand over (or,
for a check that handed none, its plain text line by line)."""

from __future__ import annotations

import re

import pytest

from grader.core.feedback import (
    HIDDEN_ANSWER,
    check_text,
    escape,
    fenced,
    markdown_output,
    markdown_results,
    shorten_arrays,
)
from grader.core.feedback_items import ITEMS, Case, Cause, Feedback, LogitCase
from grader.core.results import GradingResults, TestResult, validate_results

CAUSE = "counts every query head as a KV head (MHA instead of GQA)"
#: What check 1.3 hands over for two wrong cases of three, its cause named by both.
PART1_ITEMS = Feedback(
    causes=[Cause("mha_kv_cache", f"your code {CAUSE}")],
    cases=[
        Case("f(8B, context 1024)", "536,870,912", "compared exactly"),
        Case("f(8B, context 8192)", "8,589,934,592", "compared exactly"),
    ],
    more=1,
    ended=True,
)
PART1_OUTPUT = PART1_ITEMS.text()


def failed(
    output: str, *tags: str, number: str = "1.3", items: Feedback | None = None
) -> TestResult:
    """A failed check: its plain text, and the items it handed over (none: text only)."""
    extra = {ITEMS: items.to_json()} if items is not None else {}
    return TestResult(
        name=f"{number} a check", score=0, max_score=2, status="failed", number=number,
        output=output, tags=["part1", *tags], extra_data=extra,
    )  # fmt: skip


def handed(*cases: Case | LogitCase, number: str = "1.3", tags: tuple = (), **items) -> TestResult:
    """A failed check that handed these items over (``items``: any other field of
    :class:`Feedback`, such as ``causes=[...]``); its plain text is theirs."""
    fb = Feedback(cases=list(cases), ended=True, **{k: list(v) if isinstance(v, tuple) else v
                                                    for k, v in items.items()})  # fmt: skip
    return failed(fb.text(), *tags, number=number, items=fb)


def test_a_failed_value_check_has_verdict_cause_table_and_one_thing_to_try() -> None:
    text = markdown_output(failed(PART1_OUTPUT, items=PART1_ITEMS), None, "cpu")
    first, *rest = text.split("\n\n")
    assert first == "**Failed: 0 / 2 points.**"
    assert text.count(CAUSE) == 1  # the cause of every case, said once
    assert "| case | expected | got |" in text
    assert "| f(8B, context 1024) | the right value (compared exactly) | 536,870,912 |" in text
    assert "*(and 1 more failing case)*" in text
    assert rest[-1].startswith("**Try:** fix the likely cause above")
    assert "--parts 1" in rest[-1]


def test_several_causes_are_listed_each_once() -> None:
    fb = Feedback(cases=[Case("f(TP = 4)", "610", "compared exactly")], ended=True)
    fb.name([Cause("a", "your code A"), Cause("b", "your code B")])
    fb.name([Cause("a", "your code A")])  # the next case names A again
    text = markdown_output(failed(fb.text(), items=fb), None, "cpu")
    assert "**Likely causes:**\n\n- your code A\n- your code B" in text


def test_a_cause_keeps_its_own_subject() -> None:
    cause = Cause("no_stop", "generate did not stop at <|eot_id|>")
    text = markdown_output(handed(lead=("It ran on.",), causes=(cause,)), None, "cpu")
    assert r"**Likely cause:** generate did not stop at &lt;\|eot_id\|&gt;." in text
    assert "your code generate" not in text


def test_logit_errors_read_as_expected_and_got() -> None:
    case = LogitCase("case 1 (8 tokens)", 7.73, 0.01, "position 2 of 8")
    test = handed(case, count="0 of 10 cases correct.", number="2.4")
    text = markdown_output(test, None, "cpu")
    assert text.startswith("**Failed: 0 / 2 points.** 0 of 10 cases correct.")
    row = "| case 1 (8 tokens) | logits within 0.01 of the reference's | off by up to 7.73, "
    assert row + "first at position 2 of 8 |" in text
    assert "start with the first case in the table" in text


def test_a_hidden_check_shows_its_score_and_count_only() -> None:
    test = handed(Case("f(hidden spec #1)", "50", "compared exactly"), number="1.12",
                  causes=(Cause("mha_kv_cache", f"your code {CAUSE}"),), tags=("hidden",),
                  count="18 of 32 hidden cases correct.")  # fmt: skip
    text = markdown_output(test, None, "cpu")
    assert text.startswith("**Failed: 0 / 2 points.** 18 of 32 hidden cases correct.")
    assert "hidden spec" not in text and "50" not in text and CAUSE not in text


def test_what_the_submission_printed_is_fenced_and_cannot_break_out() -> None:
    printed = "```\n![x](http://evil/x.png) <script>alert(1)</script>"
    text = markdown_output(failed(f"It raised.\n\nYour code printed:\n{printed}"), None, "cpu")
    fence = re.search(r"^(`{4,})text$", text, re.M)
    assert fence, text  # longer than the submission's own fence
    assert text[fence.end() :].startswith(f"\n{printed}\n{fence.group(1)}\n")


def test_long_printed_output_is_cut_inside_its_fence() -> None:
    printed = "x" * 20_000 + "\nthe last line"
    data = markdown_results(
        GradingResults(tests=[failed(f"Raised.\n\nYour code printed:\n{printed}")])
    )
    text = data.to_gradescope()["tests"][0]["output"]
    assert len(text) < 5000 and "characters cut" in text and "the last line" in text
    assert text.count("```") == 2  # the fence opened is closed


def test_returned_values_cannot_draw_links_or_html() -> None:
    test = handed(Case("f(x)", "[link](http://evil) <b>", "compared exactly"))
    text = markdown_output(test, None, "cpu")
    assert "[link](" not in text and "<b>" not in text
    assert r"\[link\](http://evil) &lt;b&gt;" in text


def test_long_arrays_keep_a_few_values_and_the_largest() -> None:
    assert shorten_arrays("[1, 2, 3]") == "[1, 2, 3]"
    cut = shorten_arrays("got [0.5, -7.25, 1.0, 2.0, 3.0, 4.0] here")
    assert cut == "got [0.5, -7.25, 1.0, 2.0, ... (6 values, largest magnitude 7.25)] here"


def test_escape_and_fence_helpers() -> None:
    assert escape("a|b*c `d` n_kv_heads") == r"a\|b\*c \`d\` n_kv_heads"
    assert fenced("x ```` y").startswith("`````text\n")


BENCHMARK = {
    "profile": "cpu",
    "criteria": [
        {
            "label": "batch 8 speedup (cpu time)",
            "ratio": {"median": 1.2, "low": 1.1, "high": 1.3},
            "limit": 3.69,
            "at_least": True,
            "passed": False,
        },
    ],
    "timings": {
        "batch 8, with the cache": {
            "median_s": 0.04,
            "cpu_median_s": 0.039,
            "spread": 0.05,
            "runs_s": [0.04, 0.04, 0.041],
            "peak_bytes": 2**21,
        },
    },
    "extra_rounds": 2,
}


def test_a_benchmark_check_shows_its_measurements_as_tables() -> None:
    said = ("batch 8 speedup (cpu time): 1.20x, needed at least 3.69x.",
            "Check that the cached path feeds one token per step.")  # fmt: skip
    test = handed(lead=said, number="3.11")
    # The check printed its measurements for the log; the page draws them from the record.
    test.output = "Benchmark: input 128 tokens, output 16 (cpu profile)\n  median 40.0 ms\n"
    test.tags = ["part3", "benchmark"]
    text = markdown_output(test, BENCHMARK, "cpu")
    assert "Timed by the grader on **cpu**, **cpu** threshold profile." in text
    assert "| batch 8 speedup (cpu time) | 1.20x | 1.10-1.30x | at least 3.69x | **no** |" in text
    assert "| batch 8, with the cache | 40.0 | 39.0 | 3 | 5% | 2.0 |" in text
    assert "median 40.0 ms" not in text  # the table replaces the printed lines
    assert "Check that the cached path feeds one token per step." in text
    assert "its runs were timed 2 more times" in text
    assert "| RSS growth (MB) |" in text and "NVML" not in text  # nothing read on a GPU


def test_a_gpu_benchmark_names_the_workers_figure_and_shows_the_graders_beside_it() -> None:
    timing = {**BENCHMARK["timings"]["batch 8, with the cache"],
              "peak_source": "worker", "gpu_held_bytes": 3 * 2**20}  # fmt: skip
    record = {**BENCHMARK, "profile": "cuda", "timings": {"batch 8, with the cache": timing}}
    test = failed("3.11 failed", "benchmark", number="3.11")
    test.tags = ["part3", "benchmark"]
    text = markdown_output(test, record, "cuda")
    header = ("| run | median (ms) | CPU time (ms) | runs | spread | CUDA peak, reported by your "
              "process (MB) | GPU memory held, read by the grader (NVML) (MB) |")  # fmt: skip
    assert header in text
    assert "| batch 8, with the cache | 40.0 | 39.0 | 3 | 5% | 2.0 | 3.0 |" in text


def test_results_carry_the_format_at_the_top_and_per_check() -> None:
    results = GradingResults(
        tests=[failed(PART1_OUTPUT, items=PART1_ITEMS)],
        output="part1: 0 / 2\nTotal: 0 / 2\n\nA <note>",
    )
    data = markdown_results(results).to_gradescope()
    validate_results(data)
    assert data["output_format"] == "md"
    assert data["tests"][0]["output_format"] == "md"
    assert data["output"] == "part1: 0 / 2  \nTotal: 0 / 2\n\nA &lt;note&gt;"
    assert results.tests[0].output == PART1_OUTPUT  # the plain results are left alone
    assert GradingResults.from_gradescope(data).to_gradescope() == data  # read back as is


#: What a student can make an exception message (or a printed line) say: a forged verdict
#: as a heading, a rule, lists, a setext heading, a fence, raw HTML.
FORGED = (
    "\n# Passed: 2 / 2 points.\n\n---\n- all\n+ checks\n1. passed\n2) really\nok\n===\n"
    "~~~\n<h1>x</h1>\n___"
)
#: The blocks Markdown draws from a line's first characters (a code block only from a fence).
BLOCKS = re.compile(r"<(h[1-6]|hr|ul|ol|li|blockquote|pre)\b")


def rendered(text: str) -> str:
    """``text`` as a CommonMark renderer with tables (what Gradescope draws) shows it."""
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable("table").render(text)


@pytest.mark.parametrize(
    "test",
    [
        failed(f"It raised Exception: {FORGED}"),
        handed(Case("case 1 (8 tokens)", f"forward raised Exception: {FORGED} (model.py, line 3)")),
        handed(Case("f(8B)", "1", "compared exactly"), notes=(f"Said: {FORGED}",)),
    ],
    ids=["paragraph", "in a case row", "after a value row"],
)
def test_student_text_draws_no_heading_rule_or_list(test: TestResult) -> None:
    html = rendered(markdown_output(test, None, "cpu"))
    assert not BLOCKS.findall(html), html
    assert "Passed: 2 / 2 points." in html and "<strong>Failed: 0 / 2 points.</strong>" in html
    assert "&lt;h1&gt;x&lt;/h1&gt;" in html and "&amp;lt;" not in html  # escaped exactly once
    assert "\\" not in html  # every escape is invisible on the page


def test_student_text_in_the_summary_and_benchmark_words_stays_text() -> None:
    test = failed(f"Benchmark: input 128 tokens (cpu profile)\nIt raised: {FORGED}")
    test.tags = ["part3", "benchmark"]
    results = GradingResults(tests=[test], output=f"part3: 0 / 2\n\nimport failed: {FORGED}")
    data = markdown_results(results).to_gradescope()
    for text in (data["output"], markdown_output(test, BENCHMARK, "cpu")):
        html = rendered(text)
        assert not BLOCKS.findall(html), html
        assert "Passed: 2 / 2 points." in html


def test_printed_text_stays_in_its_code_block() -> None:
    text = markdown_output(failed(f"It raised.\n\nYour code printed:\n{FORGED}"), None, "cpu")
    html = rendered(text)
    assert [m.group(1) for m in BLOCKS.finditer(html)] == ["pre"], html
    assert "# Passed: 2 / 2 points." in html.split("<pre>", 1)[1]


def test_a_normal_message_still_reads_well() -> None:
    html = rendered(markdown_output(failed(PART1_OUTPUT, items=PART1_ITEMS), None, "cpu"))
    assert f"<strong>Likely cause:</strong> your code {CAUSE}." in html
    assert "<td>f(8B, context 1024)</td>" in html and "<td>536,870,912</td>" in html
    assert "<em>(and 1 more failing case)</em>" in html and "\\" not in html
    logits = LogitCase("case 1", -7.25, 0.01)
    html = rendered(
        markdown_output(
            handed(logits, lead=("1. See below.",), notes=("- 2 of 8 wrong",)), None, "cpu"
        )
    )
    assert "1. See below." in html and "off by up to -7.25" in html and "- 2 of 8 wrong" in html
    assert not BLOCKS.findall(html), html


def test_a_wrong_answer_on_hidden_prompts_is_not_sent_to_the_self_check() -> None:
    """The self-check has no hidden prompt pools: it times 2.9 and 2.11 on prompts of its own
    and cannot compare their answers, so a failure of that comparison is not reproduced
    there, and its Try line must not say it is."""
    output = (
        "A timed generate(use_cache=True) of 20 tokens after 1 prompt(s) of 1000 tokens "
        "returned other tokens than the reference: its time cannot count."
    )
    test = TestResult(
        name="2.11 benchmark", score=0, max_score=3, status="failed", number="2.11",
        output=output, tags=["part2"], extra_data={HIDDEN_ANSWER: True},
    )  # fmt: skip
    text = markdown_output(test, None, "cpu")
    assert "runs this check on your machine" not in text
    try_line = text.split("\n\n")[-1]
    assert try_line.startswith("**Try:** make the other checks of this part pass")
    assert "`python selfcheck.py --parts 2`" in try_line and "cannot compare" in try_line
    assert "Try:" not in check_text(test, {}, local=True)  # never seen there; nothing to add


def test_a_returned_value_made_of_the_feedbacks_own_phrases_stays_one_cell() -> None:
    """A value of megabytes repeating "returned" and ", which is wrong (" (a reading of the
    sentences once took minutes on 24 KB of it) is one cell of one row, whatever it says."""
    piece = "a returned b, which is wrong ("
    again = f"logits differ from the reference's by up to {piece}"
    test = handed(Case("f()", piece * 2_000, "compared exactly"), Case("case 2", again))
    text = markdown_output(test, None, "cpu")
    rows = [x for x in text.splitlines() if x.startswith("| ")]
    assert rows[0] == "| case | expected | got |" and len(rows) == 3
    assert rows[1].startswith("| f() | the right value (compared exactly) | a returned b")
    assert rows[2].startswith("| case 2 |  | logits differ")
