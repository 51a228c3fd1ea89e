"""Killing processes the grader started, and everything they started in turn.

Parent-side only. A submission may fork, start new sessions or re-parent its
children to init, so each helper kills by what cannot be shed: the process
tree at the time of the call, then any process that still matches a predicate
(its uid and gid, or the sandbox folder it runs from), repeated until none is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

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
