"""``python -m grader reference-benchmarks``: the reference solution's benchmark records for
the self-check's report (its curves beside the student's).

The benchmark checks of the reference are graded on this machine's CPU and their records
(timings and criteria, as ``extra_data["benchmarks"]`` holds them) are written, with when
and where they were measured, to ``grader/gradescope/student/reference_benchmarks.json``,
which the student zip ships beside ``selfcheck.py``. The report draws them relative to the
reference's own cached time, so a student's machine need not be this one. Run it again
after a change of the ``[cpu.*]`` workloads in ``grader/core/thresholds.toml`` (a test
fails until then).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

from grader.core.paths import GRADESCOPE_FILES, SOLUTION
from grader.grading.selfcheck_page import REFERENCE_FILE

OUT = GRADESCOPE_FILES / "student" / REFERENCE_FILE
#: The checks whose records the report draws.
CHECKS = ("3.11", "4.6")


def cpu_name() -> str:
    """The processor's model name, as /proc/cpuinfo says (the platform's words elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(*, out: Path = OUT) -> dict[str, Any]:
    """Grade the reference's benchmark checks on the CPU and write their records to ``out``."""
    from grader.grading.runner import grade

    with tempfile.TemporaryDirectory() as tmp:
        results = grade(
            SOLUTION,
            results_path=Path(tmp) / "results.json",
            parts=["part3", "part4"],
            device="cpu",
            tags=frozenset({"benchmark"}),
        )
    benchmarks = (results.extra_data.get("benchmarks") or {}) if results else {}
    missing = [c for c in CHECKS if c not in benchmarks or not benchmarks[c]["passed"]]
    if missing:
        raise RuntimeError(f"the reference did not pass {', '.join(missing)}: nothing written")
    doc = {
        "measured": f"{datetime.date.today().isoformat()}, {cpu_name()}, {os.cpu_count()} "
        "cores, cpu profile, by python -m grader reference-benchmarks",
        "profile": "cpu",
        "benchmarks": {c: benchmarks[c] for c in CHECKS},
    }
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc
