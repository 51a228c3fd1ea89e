"""A readable score table for the terminal (``make grade``, ``--table``)."""

from __future__ import annotations

from grader.results import GradingResults


def score_table(results: GradingResults, *, width: int = 72) -> str:
    """One line per check, grouped by part, with part totals and the overall score."""
    lines = []
    by_part = results.by_part()
    for part, (score, max_score) in by_part.items():
        lines.append(f"{part}  {score:g} / {max_score:g}")
        for t in results.tests:
            if t.part != part:
                continue
            mark = "PASS" if t.status == "passed" else "FAIL"
            name = t.name if len(t.name) <= width - 22 else t.name[: width - 25] + "..."
            lines.append(f"  {mark}  {name:<{width - 22}} {t.score:>5g} / {t.max_score:<4g}")
    lines.append(f"TOTAL  {results.score:g} / {results.max_score:g}")
    return "\n".join(lines)


def failure_details(results: GradingResults) -> str:
    """The feedback of every failed check, as the student sees it."""
    blocks = []
    for t in results.tests:
        if t.status == "failed":
            blocks.append(f"[{t.number}] {t.name}\n{t.output.strip()}")
    return "\n\n".join(blocks)
