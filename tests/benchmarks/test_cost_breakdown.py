"""benchmarks/cost_breakdown.py: one grading's CPU seconds by process role and by check."""

from __future__ import annotations

import json
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
    part2 = tool.checks_table(tool.check_costs(ROWS)).splitlines()[-1].split()
    assert part2 == ["part2", "4", "0.60", "0.75", "0.25"]  # the part's sums, last
    table = tool.roles_table(tool.role_seconds(SEEN, GRADER, ROWS), 9.0, 7.975)
    assert "untraced" in table
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


def test_a_trace_alone_gives_the_phases_and_the_references_workers(capsys, tmp_path) -> None:
    """A GPU grading's trace, read without grading: wall seconds by phase, and per part
    how many reference workers and model builds it took."""
    rows = [
        {"part": "part2", "trusted": True, "pid": 7, "op": "load", "timed": False,
         "start_s": 4.0, "seconds": 10.0},
        {"part": "part2", "trusted": True, "pid": 7, "op": "generate", "timed": False,
         "start_s": 0.0, "seconds": 3.0},
        {"part": "part2", "trusted": True, "pid": 7, "op": "generate", "timed": True,
         "start_s": 0.0, "seconds": 1.5, "check": "2.11"},
        {"part": "part2", "trusted": False, "pid": 8, "op": "load", "timed": False,
         "start_s": 3.5, "seconds": 9.0, "check": "2.1"},
        {"part": "part2", "trusted": False, "pid": 8, "op": "generate", "timed": True,
         "start_s": 0.0, "seconds": 2.0, "cpu_s": 1.9, "check": "2.11"},
    ]  # fmt: skip
    phases = tool.phase_seconds(rows)
    assert phases["seconds"] == {
        "worker starts": 7.5, "model builds": 19.0, "submission timed": 2.0,
        "reference timed": 1.5, "submission other": 0.0, "reference other": 3.0,
    }  # fmt: skip
    assert phases["reference"] == {"part2": {"workers": 1, "builds": 1}}
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert tool.main(["--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "part2: 1 reference worker(s), 1 build(s)" in out and "2.11" in out
