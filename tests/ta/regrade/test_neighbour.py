"""A class regrade grades submissions side by side: a submission that floods the machine
with busy loops takes no CPU from the one graded beside it, and its own timeout is still
blamed on its code (it had its share of the machine, and crowded itself out of it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grader.sandbox import cpu_share
from grader.ta.regrade import batch
from tests.conftest import ATTACK, SOLUTION

pytestmark = [pytest.mark.xdist_group("batch"), ATTACK]

#: Appended to Part 1's question1.py: 300 busy loops through the first 90 s of its grading
#: (the neighbour's Parts 1 and 2 in it; a worker started again floods again until then),
#: forked first and spinning together 5 s later, and an answer table that never returns.
#: Each loop leads a session of its own: where the kernel groups processes by session
#: (autogroup), that makes 300 groups of one, each weighing as much as the neighbour's
#: (on 2 cores, 100 such loops slowed the neighbour 15 times; 300 leave its timed runs a
#: few percent of a core).
FLOOD = """
import os as _os
import time as _time

_MARK = _os.path.expanduser("~/.flood_until")
try:
    with open(_MARK) as _f:
        _UNTIL = float(_f.read())
except (OSError, ValueError):
    _UNTIL = _time.time() + 90
    with open(_MARK, "w") as _f:
        _f.write(str(_UNTIL))
_START = _time.time() + 5
for _ in range(300):
    if _time.time() < _UNTIL and _os.fork() == 0:
        _os.setsid()
        _time.sleep(max(0.0, _START - _time.time()))
        while _time.time() < _UNTIL:
            pass
        _os._exit(0)


def answer_table(*args, **kwargs):
    while True:
        pass
"""

HUNG = "(an infinite loop, or far too slow)"


def _grouped() -> bool:
    grading = cpu_share.create("probe")
    try:
        return any("cpu" in g.controllers for g in grading.groups)
    finally:
        grading.remove()


def _export(root: Path) -> Path:
    """The flooder (Part 1 only) and the reference solution, as a two-submission export."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.png")
    flooder, honest = root / "submission_1", root / "submission_2"
    shutil.copytree(SOLUTION, flooder, ignore=ignore)
    shutil.copytree(SOLUTION, honest, ignore=ignore)
    (flooder / "transformer_skeleton.py").unlink()  # its Part 2 is not graded: quick
    with open(flooder / "question1.py", "a") as f:
        f.write(FLOOD)
    (root / "submission_metadata.yml").write_text(
        "".join(f"submission_{i}:\n  :submitters:\n  - :name: S{i}\n" for i in (1, 2))
    )
    return root


@pytest.mark.needs_root(reason="needs a writable cpu controller", available=_grouped)
def test_busy_loops_beside_the_reference_cost_it_nothing(tmp_path: Path) -> None:
    """Without a share per grading the reference beside the loops lost 2.9 (its request
    starved: the message says the machine was busy) and 2.11 on this check's 2-core VM."""
    export = _export(tmp_path / "export")
    batch.main(
        export_dir=export, out_dir=tmp_path / "out", jobs=2, parts=["part1", "part2"],
        progress=False,
    )  # fmt: skip
    results = {
        name: json.loads((tmp_path / "out" / "results" / name / "results.json").read_text())
        for name in ("submission_1", "submission_2")
    }
    honest, flooder = results["submission_2"], results["submission_1"]
    part2 = [t for t in honest["tests"] if t["number"].startswith("2.")]
    lost = {t["number"]: t.get("output", "")[:300] for t in part2 if t["score"] < t["max_score"]}
    assert sum(t["score"] for t in part2) == 30, lost
    assert not any((t.get("extra_data") or {}).get("starved") for t in honest["tests"])
    # Its timed runs had their share of the CPU (without one they got under 2 % of a core;
    # with one, a part of the machine beside whatever else runs on it).
    timings = honest["extra_data"]["benchmarks"]["2.11"]["timings"]
    shares = {name: t["cpu_median_s"] / t["median_s"] for name, t in timings.items()}
    assert min(shares.values()) > 0.1, shares
    for data in results.values():  # each grading had a share of its own, and says so
        assert "cpu." in data["extra_data"]["cpu_isolation"], data["extra_data"]
    # The loops ran: the flooder's own requests ran out of time among them, and each is
    # blamed on its code (it crowded itself out of its share), not on the machine.
    stopped = [t for t in flooder["tests"] if "did not finish within" in t["output"]]
    assert stopped and all(HUNG in t["output"] for t in stopped), stopped
    assert not any((t.get("extra_data") or {}).get("starved") for t in flooder["tests"])
