"""Killing what the grader started: whole trees across sessions, and stragglers by predicate."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import psutil

from grader.sandbox.processes import kill_matching, kill_tree


def _wait_for_children(pid: int, n: int) -> list[psutil.Process]:
    for _ in range(100):
        kids = psutil.Process(pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError("the child did not start its own child")


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_kill_tree_reaches_a_grandchild_in_its_own_session() -> None:
    code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    (grandchild,) = _wait_for_children(parent.pid, 1)
    kill_tree(parent.pid)
    parent.wait(timeout=5)
    psutil.wait_procs([grandchild], timeout=5)
    assert _gone(grandchild)


def test_kill_matching_kills_every_match_and_counts_them() -> None:
    marker = f"kvgrader-test-{uuid.uuid4().hex}"
    code = "import time; time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code, marker]) for _ in range(3)]
    bystander = subprocess.Popen([sys.executable, "-c", code])
    try:
        killed = kill_matching(lambda p: marker in (p.info["cmdline"] or []), ["cmdline"])
        assert killed == 3
        assert not any(psutil.pid_exists(p.pid) for p in procs)  # killed and reaped
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
