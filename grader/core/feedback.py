"""Gradescope feedback in its Markdown format (``output_format: "md"``).

The checks write plain sentences; this module lays them out for the page a student
reads: a verdict line, the named likely cause, the failing cases as an expected/got
table, what the submission printed in a fenced block, the measurements of a benchmark
check as tables, and one thing to try. Pure functions over the results: the runner
applies :func:`markdown_results` to the file it writes and keeps its plain text for
the terminal.

Text that comes from the submission (values it returned, what it printed) is either
fenced or escaped, so it cannot draw links, images or HTML on the page. A check with
hidden cases shows its score, its count of cases and nothing else about them.
"""

from __future__ import annotations

import html
import re
from dataclasses import replace
from typing import Any

from grader.core.results import GradingResults, TestResult, truncate

#: Numbers in a bracketed list beyond which it is cut ("a few values" and the count).
MOST_VALUES = 4
#: What the submission printed is shown up to this many characters (its start and end).
MAX_PRINTED_CHARS = 3000

CAUSE = re.compile(
    r"(?:Several known mistakes seem present at once\. )?"
    r"Likely causes?: (?P<text>.+)$"
)
#: How a check lists several causes in one sentence.
CAUSE_JOIN = re.compile(r"; (?:or|and your code) ")
#: "18 of 32 hidden cases correct.": the verdict line carries it.
COUNT = re.compile(r"^\d+ of \d+ (?:hidden )?cases? correct\.$")
#: "f(args) returned V, which is wrong (compared exactly)."
RETURNED = re.compile(
    r"^(?P<case>.+?) returned (?P<got>.+?), which is wrong \((?P<how>[^)]*)\)\.?$"
)
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


#: What makes a line of text a Markdown block of its own where it starts a line (after up
#: to any indent): a heading (``#``), a setext underline (``===``, ``---``), a rule
#: (``---``, ``___``), a list item (``- ``, ``+ ``), a ``~~~`` fence. The star, the
#: backtick, ``|`` and ``>`` (as ``&gt;``) are escaped wherever they are; ``-7.25`` and
#: ``_name`` stay as they are.
BLOCK_MARK = re.compile(r"^([ \t]*)(#|=|~(?=~)|[-_](?=[-_ \t]|$)|\+(?=[ \t]|$))", re.M)
#: An ordered list item ("1. ", "2) "): its dot or parenthesis is escaped, never a number.
ORDERED_MARK = re.compile(r"^([ \t]*\d{1,9})([.)])(?=[ \t]|$)", re.M)


def escape(text: str) -> str:
    """``text`` safe in a Markdown paragraph or table cell: HTML and the characters that
    start links, images, code or tables are escaped, and so is whatever would make one of
    its lines a heading, a list item, a rule or a fence (text from a submission may hold
    line breaks, and each line is a line of the page); words with underscores stay as they
    are (CommonMark does not emphasise inside a word). A backslash before punctuation
    renders as the punctuation alone, so the student reads their text unchanged."""
    text = html.escape(re.sub(r"\r\n?", "\n", text), quote=False)
    text = re.sub(r"([\\`*\[\]|!])", r"\\\1", text)
    text = BLOCK_MARK.sub(r"\1\\\2", text)
    return ORDERED_MARK.sub(r"\1\\\2", text)


def fenced(text: str, info: str = "text") -> str:
    """``text`` in a code fence longer than any run of backticks inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def shorten_arrays(text: str) -> str:
    """Every bracketed list of more than :data:`MOST_VALUES` numbers cut to its first few,
    its length and its largest magnitude: a long array never lands on the page whole."""

    def cut(match: re.Match[str]) -> str:
        values = [v.strip() for v in match.group()[1:-1].split(",")]
        try:
            largest = max(abs(float(v)) for v in values)
        except ValueError:
            return match.group()
        head = ", ".join(values[:MOST_VALUES])
        return f"[{head}, ... ({len(values)} values, largest magnitude {largest:g})]"

    return NUMBER_LIST.sub(cut, text)


def verdict(test: TestResult, count: str = "") -> str:
    """The first line: passed or not, the points, and how many cases were right."""
    if "bonus" in test.tags:
        mark = "Extra credit" if test.score > 0 else "No extra credit"
        line = f"**{mark}: {test.score:g} points.**"
    else:
        mark = "Passed" if test.status == "passed" else "Failed"
        line = f"**{mark}: {test.score:g} / {test.max_score:g} points.**"
    return f"{line} {escape(count)}" if count else line


def cause_block(causes: list[str]) -> str:
    """The named causes, each once: a sentence for one, a list for several."""
    if len(causes) == 1:
        return f"**Likely cause:** {escape(causes[0])}."
    return "**Likely causes:**\n\n" + "\n".join(f"- {escape(c)}" for c in causes)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("\n", " ") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


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


def case_row(line: str) -> list[str] | None:
    """``[case, expected, got]`` for a line of a failing case ("" columns unknown)."""
    if m := RETURNED.match(line):
        return [m["case"], f"the right value ({m['how']})", m["got"]]
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


def case_section(lines: list[str]) -> list[str]:
    """The failing cases as one table (rows in the checks' order); the other lines as
    paragraphs around it."""
    before, rows, after = [], [], []
    for line in lines:
        row = case_row(line)
        if row is not None:
            rows.append([escape(shorten_arrays(c)) for c in row])
        elif MORE.match(line) and rows:
            after.append(f"*{escape(line)}*")
        else:
            (after if rows else before).append(escape(shorten_arrays(line)))
    blocks = ["  \n".join(before)] if before else []
    if rows:
        with_expected = any(r[1] for r in rows)
        header = ["case", "expected", "got"] if with_expected else ["case", "what happened"]
        body = rows if with_expected else [[r[0], r[2]] for r in rows]
        blocks.append(table(header, body))
    if after:
        blocks.append("  \n".join(after))
    return blocks


#: The detail (``extra_data`` key) a check carries when its part was not graded for want
#: of a file: its one thing to try is to upload it, not to run the self-check.
NOT_GRADED = "not_graded"


def try_next(test: TestResult, causes: list[str], cases: bool) -> str:
    """The one thing to try, for a failed check."""
    part = test.part.removeprefix("part")
    selfcheck = f"`python selfcheck.py --parts {part}`" if part else "`python selfcheck.py`"
    if test.extra_data.get(NOT_GRADED) == "missing":
        return "**Try:** upload the files named above and resubmit."
    if causes:
        return f"**Try:** fix the likely cause above, then run {selfcheck} again."
    if cases:
        return f"**Try:** start with the first case in the table; {selfcheck} runs it locally."
    return f"**Try:** {selfcheck} runs this check on your machine, with this message."


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


def benchmark_tables(record: dict[str, Any], device: str) -> list[str]:
    """What a benchmark check measured: its thresholds, met or not, then every timed run."""
    criteria = []
    for c in record.get("criteria", []):
        ratio = c.get("ratio") or {}
        measured = f"{ratio.get('median', float('nan')):.2f}x"
        spread = f"{ratio.get('low', float('nan')):.2f}-{ratio.get('high', float('nan')):.2f}x"
        need = f"{'at least' if c.get('at_least') else 'at most'} {c.get('limit', 0):g}x"
        criteria.append([escape(str(c.get("label", ""))), measured, spread, need,
                         "yes" if c.get("passed") else "**no**"])  # fmt: skip
    timings = (record.get("timings") or {}).values()
    memory = memory_label([t.get("peak_source") for t in timings], record.get("profile")) + " (MB)"
    held = any(t.get("gpu_held_bytes") is not None for t in timings)
    runs = []
    for name, t in (record.get("timings") or {}).items():
        runs.append([escape(name), f"{t.get('median_s', 0) * 1000:.1f}",
                     f"{t.get('cpu_median_s', 0) * 1000:.1f}", str(len(t.get("runs_s", []))),
                     f"{t.get('spread', 0):.0%}", megabytes(t.get("peak_bytes")),
                     *([megabytes(t.get("gpu_held_bytes"))] if held else [])])  # fmt: skip
    blocks = [f"Timed by the grader on **{escape(device)}**, "
              f"**{escape(str(record.get('profile', '')))}** threshold profile."]  # fmt: skip
    if criteria:
        blocks.append(table(["measure", "measured", "runs", "needed", "met"], criteria))
    if runs:
        header = ["run", "median (ms)", "CPU time (ms)", "runs", "spread", memory]
        header += [f"{GPU_HELD} (MB)"] if held else []
        blocks.append(table(header, runs))
    if record.get("extra_rounds"):
        blocks.append(confirmed(record["extra_rounds"]))
    return blocks


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


def markdown_output(test: TestResult, benchmark: dict[str, Any] | None, device: str) -> str:
    """One check's feedback in Markdown."""
    output, printed = test.output, ""
    if PRINTED in output:
        output, printed = output.split(PRINTED, 1)
    lines = [x for x in output.splitlines() if x.strip()]
    count = lines.pop(0) if lines and COUNT.match(lines[0]) else ""
    if "hidden" in test.tags:
        blocks = [verdict(test, count)]
        if test.status != "passed":
            blocks.append(HIDDEN_NOTE)
        return "\n\n".join(blocks)
    if benchmark is not None:
        words, causes = split_causes(benchmark_words("\n".join(lines)))
        body = [*benchmark_tables(benchmark, device), *(escape(w) for w in words)]
    else:
        kept, causes = split_causes(lines)
        body = case_section(kept)
    blocks = [verdict(test, count), *([cause_block(causes)] if causes else []), *body]
    if printed.strip():  # cut first, so that the page's own limit never cuts the fence
        blocks += ["Your code printed:", fenced(truncate(printed.strip(), MAX_PRINTED_CHARS))]
    if test.status != "passed" and benchmark is None:
        blocks.append(try_next(test, causes, any(b.startswith("| case") for b in body)))
    return "\n\n".join(blocks)


def summary_markdown(text: str) -> str:
    """The top of the page: every line kept, as Markdown lines."""
    paragraphs = text.strip().split("\n\n")
    return "\n\n".join("  \n".join(escape(x) for x in p.splitlines()) for p in paragraphs)


def markdown_results(results: GradingResults) -> GradingResults:
    """A copy of ``results`` whose page and checks speak Markdown (``output_format: md``);
    a check's numbers come from the benchmark records the run kept in ``extra_data``."""
    benchmarks = results.extra_data.get("benchmarks") or {}
    device = str(results.extra_data.get("device", ""))
    tests = [
        replace(
            t,
            output=markdown_output(t, benchmarks.get(t.number), device),
            output_format="md",
        )
        for t in results.tests
    ]
    return replace(
        results, tests=tests, output=summary_markdown(results.output), output_format="md"
    )
