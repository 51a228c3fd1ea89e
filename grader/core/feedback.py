"""A check's feedback: its plain sentences laid out as structure, rendered for the reader.

The checks write plain sentences; this module lays them out as blocks
(:mod:`grader.core.document`): a verdict line, the named likely cause, the failing cases as
an expected/got table, what the submission printed, the measurements of a benchmark check
as tables, and one thing to try. :func:`markdown_results` renders them as Gradescope's
Markdown (``output_format: "md"``) and keeps the blocks in each check's
``extra_data.feedback``, so that the terminal (:func:`check_text`) and the HTML reports
(:func:`check_html`) render the same feedback for their medium, from a live grading or a
results file read back.

Text that comes from the submission (values it returned, what it printed) is fenced or
escaped once in each medium, so it cannot draw links, images or HTML on the page. A check
with hidden cases shows its score, its count of cases and nothing else about them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

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
from grader.core.results import GradingResults, TestResult, truncate
from grader.core.score import is_bonus, points_text

__all__ = ["escape", "fenced", "markdown_output", "markdown_results", "shorten_arrays"]

#: Numbers in a bracketed list beyond which it is cut ("a few values" and the count).
MOST_VALUES = 4
#: What the submission printed is shown up to this many characters (its start and end).
MAX_PRINTED_CHARS = 3000
#: A check's own text is read into blocks up to this many characters (its start and end):
#: twice what the page shows (results.MAX_TEST_OUTPUT_CHARS), since a check's messages
#: quote what the submission returned, and the blocks are kept in the results file too.
MAX_CHECK_TEXT_CHARS = 16_000

CAUSE = re.compile(
    r"(?:Several known mistakes seem present at once\. )?"
    r"Likely causes?: (?P<text>.+)$"
)
#: How a check lists several causes in one sentence.
CAUSE_JOIN = re.compile(r"; (?:or|and your code) ")
#: "18 of 32 hidden cases correct.": the verdict line carries it.
COUNT = re.compile(r"^\d+ of \d+ (?:hidden )?cases? correct\.$")
#: "f(args) returned V, which is wrong (compared exactly).": read by :func:`returned_parts`.
RETURNED_AT, WRONG_AT = " returned ", ", which is wrong ("
#: "case 1 (8 tokens): logits differ from the reference's by up to 7.7 (tolerance 0.01); ..."
LOGITS = re.compile(
    r"^(?P<case>[^:]+): logits differ from the reference's by up to (?P<err>\S+) "
    r"\(tolerance (?P<tol>[^)]+)\)(?:; first wrong (?P<where>.+?))?\.?$"
)
#: "case 2: <what happened>" (any other per-case line)
CASE = re.compile(r"^(?P<case>(?:case|hidden model|public model)\b[^:]{0,80}): (?P<what>.+)$")
MORE = re.compile(r"^\(and \d+ more failing cases?\)$")
NUMBER = r"\s*-?[\d.eE+-]+\s*"
NUMBER_LIST = re.compile(rf"\[(?:{NUMBER},){{{MOST_VALUES},}}{NUMBER}\]")
PRINTED = "\n\nYour code printed:\n"
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


def split_causes(lines: list[str]) -> tuple[list[str], list[str]]:
    """The lines without their "Likely cause" sentences, and those causes, each once."""
    causes: list[str] = []
    kept = []
    for line in lines:
        at = line.find("Likely cause")
        at = line.find("Several known mistakes") if "Several known mistakes" in line else at
        if at >= 0 and (m := CAUSE.match(line[at:])):
            text = m.group("text")
            # "your code A; or B": each cause keeps the sentence's subject
            subject = "your code " if text.startswith("your code ") else ""
            for part in CAUSE_JOIN.split(text.removeprefix(subject)):
                cause = subject + part.strip().removesuffix(".")
                if part.strip() and cause not in causes:
                    causes.append(cause)
            line = line[:at].rstrip()
        if line:
            kept.append(line)
    return kept, causes


def returned_parts(line: str) -> tuple[str, str, str] | None:
    r"""``(case, got, how)`` of "CASE returned GOT, which is wrong (HOW)." (the period
    optional), as the regular expression ``^(.+?) returned (.+?), which is wrong
    \(([^)]*)\)\.?$`` reads it; None for another line. Read from both ends in time
    linear in the line: GOT is the student's value, which may hold both phrases
    thousands of times, and that expression backtracked for minutes on 24 KB of them."""
    body = line[:-1] if line.endswith(".") else line
    at = body.find(RETURNED_AT, 1)
    if not body.endswith(")") or at < 0:
        return None
    got = at + len(RETURNED_AT)
    # HOW holds no ")": the phrase begins after the last ")" but the closing one.
    last = body.rfind(")", 0, len(body) - 1)
    wrong = body.find(WRONG_AT, max(got + 1, last - len(WRONG_AT) + 1))
    if wrong < 0:
        return None
    return body[:at], body[got:wrong], body[wrong + len(WRONG_AT) : -1]


def case_row(line: str) -> list[str] | None:
    """``[case, expected, got]`` for a line of a failing case ("" columns unknown)."""
    if parts := returned_parts(line):
        case, got, how = parts
        return [case, f"the right value ({how})", got]
    if m := LOGITS.match(line):
        where = f", first at {m['where']}" if m["where"] else ""
        return [
            m["case"],
            f"logits within {m['tol']} of the reference's",
            f"off by up to {m['err']}{where}",
        ]
    if m := CASE.match(line):
        return [m["case"], "", m["what"]]
    return None


def case_section(lines: list[str]) -> list[Block]:
    """The failing cases as one table (rows in the checks' order); the other lines as
    paragraphs around it."""
    before: list[Line] = []
    after: list[Line] = []
    rows: list[list[str]] = []
    for line in lines:
        row = case_row(line)
        if row is not None:
            rows.append([shorten_arrays(c) for c in row])
        elif MORE.match(line) and rows:
            after.append([span(line, "em")])
        else:
            (after if rows else before).append([span(shorten_arrays(line))])
    blocks = [paragraph(*before)] if before else []
    if rows:
        with_expected = any(r[1] for r in rows)
        header = ["case", "expected", "got"] if with_expected else ["case", "what happened"]
        body = rows if with_expected else [[r[0], r[2]] for r in rows]
        blocks.append(table(header, [[[span(c)] for c in r] for r in body]))
    if after:
        blocks.append(paragraph(*after))
    return blocks


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


#: Where a benchmark run's peak memory was read (``Sample.peak_source``), as a column name.
MEMORY_SOURCES = {"rss": "RSS growth", "worker": "CUDA peak, reported by your process"}
#: The GPU memory the worker held, read by the grader through NVML (``gpu_held_bytes``).
GPU_HELD = "GPU memory held, read by the grader (NVML)"


def memory_label(sources: list[str | None], profile: str | None) -> str:
    """The name of the peak-memory figures read from ``sources``: the worker's own report
    is named as such wherever one run's came from it."""
    for source in ("worker", "rss"):
        if source in sources:
            return MEMORY_SOURCES[source]
    return MEMORY_SOURCES["worker" if profile == "cuda" else "rss"]


def megabytes(n: Any) -> str:
    """``n`` bytes in MB with one decimal; blank when not measured."""
    return f"{n / 2**20:.1f}" if isinstance(n, (int, float)) else ""


def cells(*texts: str) -> list[Line]:
    return [[span(t)] for t in texts]


def benchmark_tables(record: dict[str, Any], device: str) -> list[Block]:
    """What a benchmark check measured: its thresholds, met or not, then every timed run."""
    criteria = []
    for c in record.get("criteria", []):
        ratio = c.get("ratio") or {}
        measured = f"{ratio.get('median', float('nan')):.2f}x"
        spread = f"{ratio.get('low', float('nan')):.2f}-{ratio.get('high', float('nan')):.2f}x"
        need = f"{'at least' if c.get('at_least') else 'at most'} {c.get('limit', 0):g}x"
        met = [span("yes")] if c.get("passed") else [span("no", "strong")]
        criteria.append([*cells(str(c.get("label", "")), measured, spread, need), met])
    timings = (record.get("timings") or {}).values()
    memory = memory_label([t.get("peak_source") for t in timings], record.get("profile")) + " (MB)"
    held = any(t.get("gpu_held_bytes") is not None for t in timings)
    runs = []
    for name, t in (record.get("timings") or {}).items():
        runs.append(cells(name, f"{t.get('median_s', 0) * 1000:.1f}",
                          f"{t.get('cpu_median_s', 0) * 1000:.1f}", str(len(t.get("runs_s", []))),
                          f"{t.get('spread', 0):.0%}", megabytes(t.get("peak_bytes")),
                          *([megabytes(t.get("gpu_held_bytes"))] if held else [])))  # fmt: skip
    blocks = [paragraph([span("Timed by the grader on "), span(device, "strong"), span(", "),
                         span(str(record.get("profile", "")), "strong"),
                         span(" threshold profile.")])]  # fmt: skip
    if criteria:
        blocks.append(table(["measure", "measured", "runs", "needed", "met"], criteria))
    if runs:
        header = ["run", "median (ms)", "CPU time (ms)", "runs", "spread", memory]
        header += [f"{GPU_HELD} (MB)"] if held else []
        blocks.append(table(header, runs))
    if record.get("extra_rounds"):
        blocks.append(plain(confirmed(record["extra_rounds"])))
    if record.get("cut_short"):
        blocks.append(plain(CUT_SHORT))
    return blocks + [plain(w) for w in decision_words(record)]


def decision_words(record: dict[str, Any]) -> list[str]:
    """What a benchmark's feedback says of the criteria its runs decided late or never
    (``undecided`` and ``decided_late`` of its record; grader/runtime/verdicts.py)."""
    words, by = [], {}
    for c in record.get("criteria", []):
        by.setdefault(str(c.get("decision", "")), []).append(str(c.get("label", "")))
    if by.get("undecided"):
        words.append(
            f"Not decided: {'; '.join(by['undecided'])}. The timed runs never settled on one "
            "side of the limit, and they were no noisier than the reference solution's on "
            "the same machine, so the noise is the machine's and the limit counts as met. "
            "Your TA may time this check again on a quiet machine."
        )
    if by.get("own noise"):
        words.append(
            f"Not decided: {'; '.join(by['own noise'])}. Your timed runs were far noisier than "
            "the reference solution's on the same machine, so the noise is your code's own "
            "(runs that wait, spin or redo work at random) and the limit counts as missed. "
            "Each run of the same work should cost about the same."
        )
    if by.get("undecided, median missed"):
        words.append(
            f"Not decided, judged on the median: {'; '.join(by['undecided, median missed'])}."
        )
    if record.get("decided_late"):
        words.append(f"Decided only in the extra rounds: {'; '.join(record['decided_late'])}.")
    return words


#: What a benchmark's feedback says when its timing stopped because the timed runs' own
#: results already lost the check (the console's words and the Markdown's).
CUT_SHORT = "Timing stopped early: what the timed runs did already decides the check."


def confirmed(extra_rounds: int) -> str:
    """What a benchmark's feedback says when a miss made it time ``extra_rounds`` more
    rounds of each measurement that missed (the console's words and the Markdown's)."""
    return (
        f"A first measurement missed a threshold, so its runs were timed {extra_rounds} "
        "more times; the verdicts are on all runs."
    )


def benchmark_words(output: str) -> list[str]:
    """The benchmark check's own sentences, without the measurement lines the tables show
    (its headline and the indented lines it printed)."""
    lines = output.splitlines()
    if lines and lines[0].endswith("profile)"):
        lines = lines[1:]
    return [line for line in lines if line.strip() and not line.startswith("  ")]


def feedback_blocks(test: TestResult, benchmark: dict[str, Any] | None, device: str) -> list[Block]:
    """One check's feedback as blocks, from the plain text the check wrote."""
    output, printed = test.output, ""
    if PRINTED in output:
        output, printed = output.split(PRINTED, 1)
    lines = [x for x in truncate(output, MAX_CHECK_TEXT_CHARS).splitlines() if x.strip()]
    count = lines.pop(0) if lines and COUNT.match(lines[0]) else ""
    if "hidden" in test.tags and test.extra_data.get(NOT_GRADED):
        return [verdict(test, count), *(plain(line) for line in lines)]  # nothing ran
    if "hidden" in test.tags:
        return [verdict(test, count), *([plain(HIDDEN_NOTE)] if test.status != "passed" else [])]
    if benchmark is not None:
        words, causes = split_causes(benchmark_words("\n".join(lines)))
        body = [*benchmark_tables(benchmark, device), *(plain(w) for w in words)]
    else:
        kept, causes = split_causes(lines)
        body = case_section(kept)
    blocks = [verdict(test, count), *(cause_block(causes) if causes else []), *body]
    if printed.strip():  # cut first, so that the page's own limit never cuts the fence
        blocks += [plain("Your code printed:"), code(truncate(printed.strip(), MAX_PRINTED_CHARS))]
    if test.status != "passed" and benchmark is None:
        cases = any(b["kind"] == "table" and b["header"][0] == "case" for b in body)
        blocks += [b for b in [try_next(test, causes, cases)] if b is not None]
    return blocks


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
        tests.append(replace(t, output=to_markdown(blocks), output_format="md",
                             extra_data={**t.extra_data, FEEDBACK: blocks}))  # fmt: skip
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
