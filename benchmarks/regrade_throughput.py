"""How many submissions a class regrade grades a minute on this machine.

    python benchmarks/regrade_throughput.py [--jobs 2] [--submissions 20] [--parts part1,...]

Builds the synthetic Gradescope export of the batch tests (``tests/ta/regrade/
export_factory.py``: solutions, blanks, one Part 1 mistake each, a hang and a crash; the
mistakes' other parts are the reference's, so every part is graded) and regrades it with
``batch`` (``make batch``'s path: one ``python -m grader grade`` per submission, ``--jobs``
at a time). Prints one JSON line: submissions, wall seconds, submissions a minute, the CPU
seconds of every grading process (reaped children of this one) per submission, and the
statuses. The issue's yardstick: 20 mixed submissions with ``--jobs 2`` on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.ta.regrade import batch  # noqa: E402
from tests.ta.regrade.export_factory import build_export, plan_export  # noqa: E402


def children_cpu() -> float:
    """CPU seconds (user + system) of every child process this one has reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(*, submissions: int, jobs: int, parts: list[str] | None, seed: int) -> dict[str, Any]:
    """Regrade an export of ``submissions`` (the factory's first ones) and time it."""
    entries = plan_export(seed=seed)[:submissions]
    with tempfile.TemporaryDirectory(prefix="throughput-") as scratch:
        export = build_export(Path(scratch) / "export", entries)
        cpu, started = children_cpu(), time.monotonic()
        summary = batch.main(
            export_dir=export, out_dir=Path(scratch) / "out", jobs=jobs, parts=parts,
            progress=False,
        )  # fmt: skip
        wall, cpu = time.monotonic() - started, children_cpu() - cpu
    n = len(summary.rows)
    return {
        "submissions": n,
        "jobs": jobs,
        "parts": parts or "all",
        "wall_s": round(wall, 1),
        "per_minute": round(60 * n / wall, 2) if wall > 0 else None,
        "cpu_s_per_submission": round(cpu / n, 2) if n else None,
        "statuses": dict(summary.counts),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--submissions", type=int, default=20)
    parser.add_argument("--parts", default="", help="comma-separated (default: every part)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p] or None
    figures = measure(submissions=args.submissions, jobs=args.jobs, parts=parts, seed=args.seed)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
