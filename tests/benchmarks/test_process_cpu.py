"""benchmarks/process_cpu.py: the CPU time of a command's processes, children included."""

from __future__ import annotations

import re
import sys

from grader.ta.regen import import_path
from tests.conftest import ROOT

BUSY = "import time; end = time.process_time() + 0.4\nwhile time.process_time() < end: pass"


def test_a_child_process_is_counted_and_named(capsys) -> None:
    tool = import_path(ROOT / "benchmarks" / "process_cpu.py", "process_cpu_test")
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}])"
    assert tool.main(["--every-ms", "20", "--", sys.executable, "-c", child]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if " cpu " in line]
    busy = [
        float(re.search(r"cpu +([\d.]+) s", row).group(1)) for row in rows if "process_time" in row
    ]
    assert busy and max(busy) >= 0.3, out  # the child, by its command, with its CPU time
    total = float(re.search(r"total CPU ([\d.]+) s", out).group(1))
    assert total >= 0.3, out
