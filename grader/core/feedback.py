"""A check's feedback laid out as blocks from the items it handed over, rendered for the
reader.

A check hands over its feedback as items (:mod:`grader.core.feedback_items`): failing
cases, the likely causes it named, measurements, its own lines and what the submission
printed. This module lays them out as blocks (:mod:`grader.core.document`): a verdict
line, the named likely cause, the failing cases as an expected/got table, what the
submission printed, the measurements of a benchmark check as tables, and one thing to try;
the layout follows the items' fields, never their wording. :func:`markdown_results`
renders them as Gradescope's Markdown (``output_format: "md"``) and keeps the blocks in
each check's ``extra_data.feedback``, so that the terminal (:func:`check_text`) and the
HTML reports (:func:`check_html`) render the same feedback for their medium, from a live
grading or a results file read back. A check that handed over no items (one stopped by an
error of the grader's) shows its plain text, line by line.

Text that comes from the submission (values it returned, what it printed) is fenced or
escaped once in each medium, so it cannot draw links, images or HTML on the page. A check
with hidden cases shows its score, its count of cases and nothing else about them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from grader.core.benchmark_feedback import (
    CUT_SHORT,
    GPU_HELD,
    benchmark_tables,
    confirmed,
    decision_words,
    memory_label,
)
from grader.core.document import (
    Block,
    Line,
    advice,
    bullets,
    code,
    escape,
    fenced,
    paragraph,
    plain,
    span,
    table,
    to_html,
    to_markdown,
    to_text,
    unescape,
)
from grader.core.feedback_items import ITEMS, MAX_CHECK_TEXT_CHARS, Case, Feedback, more_text
from grader.core.results import GradingResults, TestResult, truncate
from grader.core.score import is_bonus, points_text

__all__ = [
    "CUT_SHORT",
    "GPU_HELD",
    "MAX_CHECK_TEXT_CHARS",
    "confirmed",
    "decision_words",
    "escape",
    "fenced",
    "markdown_output",
    "markdown_results",
    "memory_label",
    "shorten_arrays",
]

#: Numbers in a bracketed list beyond which it is cut ("a few values" and the count).
MOST_VALUES = 4
#: What the submission printed is shown up to this many characters (its start and end).
MAX_PRINTED_CHARS = 3000

NUMBER = r"\s*-?[\d.eE+-]+\s*"
NUMBER_LIST = re.compile(rf"\[(?:{NUMBER},){{{MOST_VALUES},}}{NUMBER}\]")
HIDDEN_NOTE = (
    "Its cases are hidden. The public checks of this part run the same code on public "
    "data, and their feedback says what went wrong."
)


def shorten_arrays(text: str) -> str:
    """Every bracketed list of more than :data:`MOST_VALUES` numbers cut to its first few,
    its length and its largest value (its largest magnitude where some are negative): a
    long array never lands on the page whole."""

    def cut(match: re.Match[str]) -> str:
        values = [v.strip() for v in match.group()[1:-1].split(",")]
        try:
            numbers = [float(v) for v in values]
        except ValueError:
            return match.group()
        head = ", ".join(values[:MOST_VALUES])
        if min(numbers) >= 0:
            return f"[{head}, ... ({len(values)} values, the largest {max(numbers):g})]"
        largest = max(abs(v) for v in numbers)
        return f"[{head}, ... ({len(values)} values, largest magnitude {largest:g})]"

    return NUMBER_LIST.sub(cut, text)


def verdict(test: TestResult, count: str = "") -> Block:
    """The first line: passed or not, the points, and how many cases were right."""
    if is_bonus(test):
        mark = "Extra credit" if test.score > 0 else "No extra credit"
        line = f"{mark}: {points_text(test.score)}."
    else:
        mark = "Passed" if test.status == "passed" else "Failed"
        line = f"{mark}: {points_text(test.score, test.max_score)}."
    return paragraph([span(line, "strong"), *([span(f" {count}")] if count else [])])


def cause_block(causes: list[str]) -> list[Block]:
    """The named causes, each once: a sentence for one, a list for several."""
    if len(causes) == 1:
        return [paragraph([span("Likely cause:", "strong"), span(" "), span(causes[0]),
                           span(".")])]  # fmt: skip
    return [paragraph([span("Likely causes:", "strong")]), bullets([[span(c)] for c in causes])]


#: The detail (``extra_data`` key) a check carries when its part was not graded for want
#: of a file: "missing" on the part's first check, whose one thing to try is to upload it
#: (not to run the self-check); "see_first" on the others, which point to it.
NOT_GRADED = "not_graded"
#: The detail a check carries when a timed run's answer differed from the reference's on
#: the hidden prompt pools: the self-check, without them, times that check but cannot
#: compare its answer, so it cannot show this failure.
HIDDEN_ANSWER = "hidden_answer"


def try_next(test: TestResult, causes: list[str], cases: bool) -> Block | None:
    """The one thing to try, for a failed check (worded by the medium that shows it); None
    where the part's first check already says it."""
    part = test.part.removeprefix("part")
    if test.extra_data.get(NOT_GRADED) == "see_first":
        return None
    if test.extra_data.get(NOT_GRADED) == "missing":
        return advice("upload", part)
    if test.extra_data.get(HIDDEN_ANSWER):
        return advice("hidden", part)
    return advice("cause" if causes else "case" if cases else "check", part)


def item_section(fb: Feedback) -> list[Block]:
    """The failing cases of ``fb`` as one table (in the check's order), its own lines
    around it: what it said before the cases, then each case's remark, the count of cases
    left out and its notes."""
    blocks = [paragraph(*([span(shorten_arrays(x))] for x in fb.lead))] if fb.lead else []
    if fb.cases:
        rows = [[shorten_arrays(c) for c in case.row()] for case in fb.cases]
        with_expected = any(r[1] for r in rows)
        header = ["case", "expected", "got"] if with_expected else ["case", "what happened"]
        body = rows if with_expected else [[r[0], r[2]] for r in rows]
        blocks.append(table(header, [[[span(c)] for c in r] for r in body]))
    after: list[Line] = [
        [span(shorten_arrays(f"{c.label}: {c.remark}"))]
        for c in fb.cases
        if isinstance(c, Case) and c.remark
    ]
    after += [[span(more_text(fb.more), "em")]] if fb.more else []
    after += [[span(shorten_arrays(x))] for x in fb.notes]
    return [*blocks, *([paragraph(*after)] if after else [])]


def item_blocks(
    test: TestResult, fb: Feedback, benchmark: dict[str, Any] | None, device: str
) -> list[Block]:
    """One check's feedback as blocks, laid out from the items it handed over."""
    if "hidden" in test.tags:
        said = [*fb.lead, *fb.notes] if test.extra_data.get(NOT_GRADED) else []
        note = [plain(HIDDEN_NOTE)] if test.status != "passed" and not said else []
        return [verdict(test, fb.count), *(plain(x) for x in said), *note]
    if benchmark is not None:
        body = [*benchmark_tables(benchmark, device), *(plain(x) for x in fb.lead + fb.notes)]
    else:
        body = item_section(fb)
    body += [table(m.header, [[[span(c)] for c in r] for r in m.rows]) for m in fb.tables]
    causes = [c.text for c in fb.causes]
    blocks = [verdict(test, fb.count), *(cause_block(causes) if causes else []), *body]
    blocks += printed_blocks(fb.printed)
    if test.status != "passed" and benchmark is None:
        blocks += [b for b in [try_next(test, causes, bool(fb.cases))] if b is not None]
    return blocks


def printed_blocks(printed: str) -> list[Block]:
    """What the submission printed, fenced (none where it printed nothing); cut first, so
    that the page's own limit never cuts the fence."""
    if not printed.strip():
        return []
    return [plain("Your code printed:"), code(truncate(printed.strip(), MAX_PRINTED_CHARS))]


def items_of(test: TestResult) -> Feedback | None:
    """The items a check handed over, where its page is to be laid out from them: it ended
    on them (passed, or failed with its own message); None where it did not (it wrote
    only text, or stopped on an error of the grader's)."""
    fb = Feedback.from_json(test.extra_data.get(ITEMS))
    if fb is None or not (fb.ended or test.status == "passed"):
        return None
    return fb


def feedback_blocks(test: TestResult, benchmark: dict[str, Any] | None, device: str) -> list[Block]:
    """One check's feedback as blocks: from the items it handed over, or else from its
    plain text, each line as it is (what it says the submission printed kept apart)."""
    fb = items_of(test)
    if fb is None:
        fb = Feedback()
        fb.line(test.output)
    return item_blocks(test, fb, benchmark, device)


def markdown_output(test: TestResult, benchmark: dict[str, Any] | None, device: str) -> str:
    """One check's feedback in Markdown."""
    return to_markdown(feedback_blocks(test, benchmark, device))


def summary_markdown(text: str) -> str:
    """The top of the page: every line kept, as Markdown lines."""
    paragraphs = text.strip().split("\n\n")
    return "\n\n".join("  \n".join(escape(x) for x in p.splitlines()) for p in paragraphs)


#: The ``extra_data`` key that keeps a check's feedback as blocks in a results file.
FEEDBACK = "feedback"


def markdown_results(results: GradingResults) -> GradingResults:
    """A copy of ``results`` whose page and checks speak Markdown (``output_format: md``),
    each check keeping its blocks in ``extra_data.feedback`` for the other readers; a
    check's numbers come from the benchmark records the run kept in ``extra_data``."""
    benchmarks = results.extra_data.get("benchmarks") or {}
    device = str(results.extra_data.get("device", ""))
    tests = []
    for t in results.tests:
        blocks = feedback_blocks(t, benchmarks.get(t.number), device)
        extra = {k: v for k, v in t.extra_data.items() if k != ITEMS}
        tests.append(replace(t, output=to_markdown(blocks), output_format="md",
                             extra_data={**extra, FEEDBACK: blocks}))  # fmt: skip
    return replace(
        results, tests=tests, output=summary_markdown(results.output), output_format="md"
    )


# ------------------------------------------------------------------ the other readers


def blocks_of(check: TestResult | Mapping[str, Any], page: Mapping[str, Any]) -> list[Block]:
    """A check's feedback as blocks, in either form: kept beside its Markdown, built from
    its plain text (``page``: the results' ``extra_data``, for the benchmark records), or,
    from a file written before the blocks were kept, its Markdown read back as text."""
    test = check if isinstance(check, TestResult) else TestResult.from_gradescope(dict(check))
    kept = test.extra_data.get(FEEDBACK)
    if isinstance(kept, list):
        return kept
    if test.output_format == "md":
        return [plain(*unescape(test.output.replace("**", "")).splitlines())]
    record = (page.get("benchmarks") or {}).get(test.number)
    return feedback_blocks(test, record, str(page.get("device", "")))


def check_text(check: TestResult | Mapping[str, Any], page: Mapping[str, Any], *,
               local: bool = False) -> str:  # fmt: skip
    """A check's feedback for a terminal (the caller makes control characters visible)."""
    return to_text(blocks_of(check, page), local=local)


def check_html(check: TestResult | Mapping[str, Any], page: Mapping[str, Any], *,
               local: bool = False) -> str:  # fmt: skip
    """A check's feedback for an HTML report, escaped once."""
    return to_html(blocks_of(check, page), local=local)


def page_text(output: str, output_format: str) -> str:
    """The page's summary as plain text, from either form (its Markdown lines end in hard
    breaks: :func:`summary_markdown`)."""
    return unescape(output.replace("  \n", "\n")) if output_format == "md" else output
