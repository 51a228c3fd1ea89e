"""benchmarks/cost_breakdown.py: one grading's CPU seconds by process role and by check."""

from __future__ import annotations

import re

from grader.ta.regen import import_path
from tests.conftest import ROOT, SOLUTION

tool = import_path(ROOT / "benchmarks" / "cost_breakdown.py", "cost_breakdown_test")

GRADER, SERVER = 100, 101
SEEN = {  # (pid, start): (CPU s, owner and command, parent, start s)
    (GRADER, 0.0): (1.0, "root python -m grader grade solution", 1, 0.0),
    (102, 0.1): (0.1, "root python -c find_spec", GRADER, 0.1),  # the grader's helper
    (SERVER, 0.2): (3.0, "root python -m grader.sandbox.forkserver_main", GRADER, 0.2),
    (103, 1.0): (0.5, "root python -m grader.sandbox.forkserver_main", SERVER, 1.0),
    (104, 1.5): (2.0, "kvgrader python -m grader.sandbox.forkserver_main", SERVER, 1.5),
    (105, 1.6): (0.25, "kvgrader python helper.py", 104, 1.6),  # started by the submission
    (106, 2.0): (0.125, "kvgrader python -m grader.sandbox.forkserver_main", SERVER, 2.0),
}
ROWS = [
    {"check": "2.7", "pid": 103, "trusted": True, "timed": True, "cpu_s": 0.25, "seconds": 0.3},
    {"check": "2.7", "pid": 104, "trusted": False, "timed": False, "cpu_s": None, "seconds": 0.5},
    {"check": "2.9", "pid": 104, "trusted": False, "timed": True, "cpu_s": 0.75, "seconds": 0.8},
    {"check": "2.9", "pid": 104, "trusted": False, "timed": False, "cpu_s": None, "seconds": 0.1},
]


def test_each_process_counts_in_its_role() -> None:
    roles = tool.role_seconds(SEEN, GRADER, ROWS)
    assert roles == {
        "grader": 1.1,  # with the helper it started
        "fork server": 3.0,
        "reference workers": 0.5,  # by the trace's pid, whatever its owner
        "submission workers": 2.25,  # with the process it started
        "untraced": 0.125,  # a worker no request names
    }


def test_each_check_sums_its_requests() -> None:
    costs = {c.check: c for c in tool.check_costs(ROWS)}
    assert list(costs) == ["2.7", "2.9"]
    assert (costs["2.7"].requests, costs["2.7"].untimed_s) == (2, 0.5)
    assert (costs["2.7"].timed_cpu_s, costs["2.7"].reference_cpu_s) == (0.0, 0.25)
    assert (costs["2.9"].untimed_s, costs["2.9"].timed_cpu_s) == (0.1, 0.75)
    table = tool.report(tool.role_seconds(SEEN, GRADER, ROWS), tool.check_costs(ROWS), 9.0, 7.975)
    assert "part2" in table and "untraced" in table
    assert re.search(r"not sampled +1\.00\n", table)  # the exact total less the sampled 6.975


def test_a_grading_is_broken_down(tmp_path) -> None:
    """A real grading of Part 1: the server imports, the submission's worker runs every
    check's requests, each named by its check."""
    figures = tool.measure(SOLUTION, "part1", 0.1)
    assert figures["score"] > 0
    roles = figures["roles"]
    assert figures["cpu_s"] >= sum(roles.values()) - 0.05  # sampled: lower bounds
    assert roles["fork server"] > 0 and roles["submission workers"] > 0 and roles["grader"] > 0
    assert roles["reference workers"] == 0  # Part 1 compares with no reference
    checks = {c["check"]: c for c in figures["checks"]}
    assert checks and all(check.startswith("1.") for check in checks)
    assert checks["1.11"]["untimed_s"] > 0  # the plots
