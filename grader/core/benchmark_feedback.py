"""A benchmark check's measurements as blocks: its thresholds, met or not, and every timed
run, from the record the grading keeps (``extra_data["benchmarks"]``), and the sentences
every view says of a measurement decided late, cut short or confirmed."""

from __future__ import annotations

from typing import Any

from grader.core.document import Block, Line, paragraph, plain, span, table

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
