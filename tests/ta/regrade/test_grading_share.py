"""Each grading of a class regrade runs inside groups of its own (a CPU share and a process
limit), the grader from its first instruction and the fork server offered to it before
anything is forked from it; its results are told which isolation it had."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grader.sandbox import cpu_share
from grader.sandbox.cpu_share import Controlled, GradingGroup
from grader.sandbox.shared import Offer
from grader.ta.regrade import one

#: Writes where it runs (its cgroups) and what it was told (the isolation) as its results.
REPORT = (
    "import json, os, sys\n"
    "json.dump({'cgroup': open('/proc/self/cgroup').read(),"
    " 'mode': os.environ.get(sys.argv[2])}, open(sys.argv[1], 'w'))\n"
)


@pytest.fixture
def grading():
    made = cpu_share.create("share-test")
    if not made.groups:
        pytest.skip("no writable cpu or pids controller here (not root, or read-only)")
    yield made
    made.remove()


def test_the_grader_runs_inside_the_gradings_groups_and_is_told_so(
    grading: GradingGroup, tmp_path: Path
) -> None:
    results = tmp_path / "results.json"
    cmd = [sys.executable, "-c", REPORT, str(results), cpu_share.MODE_ENV]
    code, status, _ = one._run_grader(cmd, results, tmp_path, 60, lambda: None, None, grading)
    assert (code, status) == (0, "graded")
    seen = json.loads(results.read_text())
    assert seen["mode"] == grading.mode and "cpu." in seen["mode"]
    assert all(g.path.name in seen["cgroup"] for g in grading.groups)


class OneOffer:
    """A batch's shared server that offers one process as a grading's fork server."""

    def __init__(self, pid: int) -> None:
        ours, self.theirs = socket.socketpair()
        self.made = Offer(ours.detach(), pid, psutil.Process(pid).create_time())

    def offer(self) -> Offer:
        return self.made


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_the_offered_server_is_moved_in_before_the_grading_gets_it(grading: GradingGroup) -> None:
    server = sleeper()
    try:
        offer = one._offered(OneOffer(server.pid), grading)  # type: ignore[arg-type]
        assert offer is not None and offer.pid == server.pid
        where = Path(f"/proc/{server.pid}/cgroup").read_text()
        assert all(g.path.name in where for g in grading.groups)
    finally:
        server.kill()
        server.wait()


def test_a_server_that_cannot_be_moved_in_is_not_offered(tmp_path: Path) -> None:
    """Its workers would be born outside the grading's share: it is stopped, and the
    grading starts servers of its own, inside."""
    refusing = GradingGroup([Controlled(tmp_path / "gone", 1, ("cpu",), ())])
    server = sleeper()
    try:
        assert one._offered(OneOffer(server.pid), refusing) is None  # type: ignore[arg-type]
        assert server.wait(timeout=30) != 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_what_a_grading_leaves_running_dies_with_its_groups(grading: GradingGroup) -> None:
    left = subprocess.Popen(grading.command([sys.executable, "-c", "import time; time.sleep(60)"]))
    deadline = time.monotonic() + 30
    while not any(str(left.pid) in Path(f).read_text() for f in grading.procs_files):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grading.remove()
    assert left.wait(timeout=30) != 0 and os.path.exists(f"/proc/{left.pid}") is False
