"""Whether a request that timed out was starved of the CPU or hung by itself.

A request that runs past its limit is the submission's fault when its code spun (it had
the CPU all along) or waited on itself (``time.sleep``, a deadlock, a read that never
returns: it asked for no CPU). It is not when the worker was ready to run and the machine
gave the CPU to something else: a neighbour in a class regrade, another job on a TA's
machine. Low CPU time alone cannot tell a starved worker from a sleeping one, so the
evidence is the time the worker spent *runnable but waiting* for a CPU:

- the worker's cgroup's ``cpu.pressure`` ("some": time during which at least one of its
  processes could run and did not; cgroup v2, :meth:`CpuGroup.waiting_s`), else
- the kernel's run-queue delay of each of its threads (``/proc/<pid>/task/*/schedstat``,
  second field), summed over the worker's processes.

A request was starved when, over its wall time, the worker ran for less than
:data:`RAN_SHARE` of it, and waited for a CPU at least :data:`WAITED_SHARE` of it and
longer than it ran, with no crowd of its own: its threads' run-queue delays, summed, come
to at most :data:`CROWD` times the wall time. A submission that starts a hundred busy loops
waits for a CPU too, a hundred threads at once: its delays sum to a hundred times the wall
time, and it is told its code was too slow, however busy the machine was besides.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from grader.sandbox.cgroups import CpuGroup

#: A starved worker ran for less than this share of the request's wall time (a quarter
#: of a core: an honest request slowed that much runs past its limit, where one slowed two
#: or three times by a busy machine does not, and an endless loop given half a core
#: is still told it is one)...
RAN_SHARE = 0.25
#: ...and waited for a CPU at least this share of it (and longer than it ran; the kernel's
#: figures lag: a worker crowded out for all of 30 s showed 17 s of waiting)...
WAITED_SHARE = 0.3
#: ...with its threads' run-queue delays summing to at most this many times the wall time
#: (a worker's few library threads, not a crowd it started itself).
CROWD = 2.0
#: The key of a check's ``extra_data`` that lists its starved requests (for TAs).
STARVED = "starved"

#: Starved requests of the check running now (taken by the check when it ends).
_EVENTS: list[dict[str, Any]] = []


@dataclass(frozen=True)
class Reading:
    """The worker's clocks at one moment: seconds on a CPU, and waiting for one."""

    at: float  # time.monotonic()
    cpu_s: float | None
    waiting_s: float | None  # time some thread of it waited (cgroup pressure), else queued_s
    queued_s: float | None = None  # its live threads' run-queue delays, summed


def starved(
    wall_s: float, cpu_s: float | None, waiting_s: float | None, queued_s: float | None = None
) -> bool:
    """Whether a request of ``wall_s`` seconds, in which the worker ran ``cpu_s``, some
    thread of it waited for a CPU ``waiting_s`` and its threads' waits summed to
    ``queued_s``, was starved by the machine (module docstring). Without the figures it
    was not: the message then says what it always said."""
    if cpu_s is None or waiting_s is None or wall_s <= 0:
        return False
    if queued_s is not None and queued_s > CROWD * wall_s:
        return False
    return cpu_s < RAN_SHARE * wall_s and waiting_s >= max(WAITED_SHARE * wall_s, cpu_s)


def _thread_clocks(pids: list[int]) -> tuple[float, float] | None:
    """(seconds run, seconds waited on a run queue) of every thread of ``pids``, from
    ``schedstat``; None where the kernel keeps none. No process is no time (a worker's
    group before the worker has joined it)."""
    if not pids:
        return 0.0, 0.0
    ran = waited = 0.0
    seen = False
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                fields = (task / "schedstat").read_text().split()
                ran, waited = ran + int(fields[0]) / 1e9, waited + int(fields[1]) / 1e9
                seen = True
            except (OSError, ValueError, IndexError):
                continue
    return (ran, waited) if seen else None


def _has_children(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).children())
    except psutil.Error:
        return False


def read(group: CpuGroup | None, pid: int | None, *, final: bool = False) -> Reading:
    """The clocks of the worker whose cgroup is ``group``: its group's counters, and the
    ``schedstat`` of the threads in it. Without a group, those of process ``pid`` alone,
    cheap enough to read at every request; the ``final`` reading of such a worker that
    started processes of its own has no waiting time (their runs are not in its figures,
    so its waiting could be on itself) and the request is never called starved."""
    now = time.monotonic()
    pids = group.pids() if group is not None else ([pid] if pid else [])
    clocks = _thread_clocks(pids)
    ran, queued = clocks if clocks is not None else (None, None)
    cpu = group.usage_s() if group is not None else ran
    waiting = group.waiting_s() if group is not None else None
    waiting = waiting if waiting is not None else queued
    if group is None and final and pid and _has_children(pid):
        waiting = None
    return Reading(now, cpu if cpu is not None else ran, waiting, queued)


def _between(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else max(0.0, after - before)


def figures(before: Reading, after: Reading) -> tuple[float, float | None, float | None]:
    """The request's wall time, and the worker's CPU and waiting time during it."""
    wall = after.at - before.at
    return wall, _between(before.cpu_s, after.cpu_s), _between(before.waiting_s, after.waiting_s)


def was_starved(before: Reading, after: Reading) -> bool:
    """Whether the worker was starved between the two readings (:func:`starved`)."""
    wall, cpu, waiting = figures(before, after)
    return starved(wall, cpu, waiting, _between(before.queued_s, after.queued_s))


def timeout_message(label: str, limit_s: float, before: Reading, after: Reading) -> str:
    """What a student reads about a request that ran past ``limit_s``: the machine was
    busy (a starved request, also kept for the check's record), or the code hung."""
    if not was_starved(before, after):
        return (
            f"{label} did not finish within {limit_s:.0f} s and was stopped "
            "(an infinite loop, or far too slow)."
        )
    wall, cpu, waiting = figures(before, after)
    assert cpu is not None and waiting is not None
    _EVENTS.append(
        {"request": label, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
         "waiting_s": round(waiting, 2)}
    )  # fmt: skip
    return (
        f"{label} did not finish within {limit_s:.0f} s and was stopped, but not because "
        f"of your code: the machine was busy. Your code was ready to run for {waiting:.0f} s "
        f"of those {wall:.0f} s and got the CPU for only {cpu:.1f} s. This check should be "
        "graded again: ask the course staff for a regrade."
    )


def taken() -> list[dict[str, Any]]:
    """The starved requests since the last call (the check that ran them keeps them)."""
    events = list(_EVENTS)
    _EVENTS.clear()
    return events
