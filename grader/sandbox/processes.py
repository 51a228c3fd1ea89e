"""Killing processes the grader started, and everything they started in turn.

Parent-side only. A submission may fork, start new sessions or re-parent its
children to init, so each helper kills by what cannot be shed: the process
tree at the time of the call, then any process that still matches a predicate
(its uid and gid, or the sandbox folder it runs from), repeated until none is left.

The grader is also the reaper of its workers' orphans (:func:`become_subreaper`): a
process that a submission double-forks away and lets exit is not reaped by init, whose
accounting the grader cannot read, but waits as a zombie of the grader's, its CPU time
still readable, until the grader reaps it (:func:`reap_orphans`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
from collections.abc import Callable, Iterable

import psutil


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group, the groups its descendants lead (a worker starts a
    session of its own), and every descendant that left them."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    for leader in [pid, *(d.pid for d in descendants)]:
        with contextlib.suppress(OSError):
            os.killpg(leader, signal.SIGKILL)  # the group led by ``leader``, if there is one
    for d in descendants:
        with contextlib.suppress(psutil.Error):
            d.kill()


def kill_matching(
    matches: Callable[[psutil.Process], bool], attrs: list[str], *, rounds: int = 50
) -> int:
    """Kill every process for which ``matches`` holds (``attrs`` are read into
    ``proc.info`` first), again and again until none is left; return how many were killed.
    Repeating catches a process that forks while it is being killed."""
    killed = 0
    for _ in range(rounds):
        found = []
        for proc in psutil.process_iter(attrs):
            with contextlib.suppress(psutil.Error, TypeError):
                if matches(proc):
                    found.append(proc)
        if not found:
            break
        for proc in found:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed += 1
        psutil.wait_procs(found, timeout=2)
    return killed


#: prctl(2)'s option that makes a process the reaper of its descendants' orphans.
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the parent of every orphan its descendants leave (Linux 3.4+),
    so that their CPU time stays readable after they exit; False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


#: prctl(2)'s option that reads whether this process is a subreaper.
PR_GET_CHILD_SUBREAPER = 37


def is_subreaper() -> bool:
    """Whether this process is the reaper of its descendants' orphans (see
    :func:`become_subreaper`); False where the kernel cannot say."""
    flag = ctypes.c_int(0)
    try:
        done = _libc().prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    return done and flag.value != 0


#: The workers this process started itself (their pids), which are never orphans.
STARTED: set[int] = set()


def orphans(keep: Iterable[int] = ()) -> list[psutil.Process]:
    """This process's children that exited and were not started by it (nor in
    ``keep``): the zombies left by a worker's descendants."""
    keep = {*STARTED, *keep}
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.pid not in keep and child.status() == psutil.STATUS_ZOMBIE:
                    found.append(child)
    return found


def reap_orphans(keep: Iterable[int] = ()) -> int:
    """Wait for every orphan zombie (see :func:`orphans`); how many were reaped."""
    reaped = 0
    for zombie in orphans(keep):
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(zombie.pid, os.WNOHANG)
            reaped += 1
    return reaped
