"""A worker's cgroup counts the CPU time of every process in it, whoever reaps it, and
removing it leaves nothing running."""

from __future__ import annotations

import os
import time

import pytest

from grader.sandbox import cgroups
from grader.sandbox.confine import join_group


@pytest.fixture
def group():
    made = cgroups.create("test")
    if made is None:
        pytest.skip("no writable cgroup hierarchy here (not root, or read-only)")
    yield made
    made.remove()


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_time_of_a_grandchild_reaped_elsewhere_is_counted(group: cgroups.CpuGroup) -> None:
    assert group.usage_s() == pytest.approx(0.0, abs=0.01)
    pid = os.fork()
    if pid == 0:  # joins, then leaves its work to an orphan grandchild
        os._exit(0 if join_group(group.procs_file) and (os.fork() or burn(0.3)) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    deadline = time.monotonic() + 10
    while group.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group.pids()
    assert (group.usage_s() or 0.0) >= 0.25


def test_remove_kills_what_is_left_and_deletes_the_group(group: cgroups.CpuGroup) -> None:
    pid = os.fork()
    if pid == 0:
        join_group(group.procs_file)
        time.sleep(60)
        os._exit(0)
    deadline = time.monotonic() + 5
    while pid not in group.pids() and time.monotonic() < deadline:
        time.sleep(0.01)
    group.remove()
    assert os.waitpid(pid, 0)[1] != 0  # killed, not finished
    assert not group.path.exists()


def test_switched_off_or_without_root_there_is_no_group(monkeypatch) -> None:
    monkeypatch.setenv(cgroups.CGROUPS_ENV, "0")
    assert cgroups.create("off") is None


def test_the_hierarchies_are_read_from_the_mount_table() -> None:
    for parent, version in cgroups.parents():
        assert version in (1, 2) and parent.is_absolute()
