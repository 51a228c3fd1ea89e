"""benchmarks/similarity_scale.py runs end to end on a small class and ranks the verbatim
copy first (the 200-submission timing is run by hand:
docs/measurements/2026-11-26-reports.md)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_a_small_class_is_timed_and_the_copy_ranks_first() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "similarity_scale.py"), "--submissions", "8"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("8 submissions, ") and " s" in lines[0]
    assert "(original) ~ submission_2 (verbatim)" in lines[1]
