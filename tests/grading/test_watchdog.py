"""The whole grading's deadline (grader/grading/watchdog.py): a thread first, then a
process that no code running in the grader can hold up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grader.core.results import validate_results
from grader.grading.watchdog import Watchdog
from tests.conftest import ROOT

#: A grader whose deadline passes while it runs C code that holds Python's lock: an
#: expression that backtracks over 2^64 ways to split its text. The thread of the
#: deadline never runs again; only the backstop can end it.
STUCK_IN_C = """
import re, sys
from pathlib import Path
from grader.grading.watchdog import Watchdog
dog = Watchdog(0.5, lambda: None, Path(sys.argv[1]), 10.0, grace_s=0.5, backstop_s=0.5)
dog.start()
re.match(r"(a+)+$", "a" * 64 + "b")
print("the expression ended", flush=True)
"""


def test_a_grader_stuck_in_c_code_is_stopped_and_its_results_written(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-c", STUCK_IN_C, str(results)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert "the expression ended" not in proc.stdout
    data = json.loads(results.read_text())
    validate_results(data)
    assert data["score"] == 0 and "did not finish within 0 s and was stopped" in data["output"]


def test_a_grading_that_ends_in_time_ends_its_backstop(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    dog = Watchdog(3600, lambda: None, results, 10.0)
    dog.start()
    backstop = dog._backstop
    assert backstop is not None and backstop.poll() is None  # waiting on the pipe
    dog.finish()
    assert backstop.returncode == 0 and not results.exists()
