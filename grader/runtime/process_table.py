"""The processes a worker's CPU clock reads without a cgroup, found cheaply.

Every request reads the worker's clock twice (:func:`grader.runtime.usage.cpu_snapshot`),
and each reading needs the processes that may hold the worker's work: its tree, the
orphans it left, the helpers its fork server reaps, and every process of the grading's
own group id. Reading every process of the machine for that (``stat`` and ``status`` of
each) made a grading's CPU time 15 % higher than with a cgroup on a busy machine, most
of it spent on processes that are none of the grading's.

Where this process is the reaper of its workers' orphans (``become_subreaper``), no
process of the worker can leave the trees rooted here and at its fork server (a shared
server's grading server is a subreaper too): a process is reparented only to its nearest
living subreaper ancestor, and a group id is inherited only by fork. So the *family*
(those trees, walked through the kernel's per-thread ``children`` lists) holds every
process the full table would have counted, and is read instead. Where this process is
no subreaper, or the kernel keeps no ``children`` lists, the whole table is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

#: One row per process: (its parent, its real gid or None when not asked for, whether it
#: is a zombie).
Row = tuple[int, int | None, bool]


def _row(pid: int, gids: bool, parent: int | None = None) -> Row | None:
    """``pid``'s row from ``/proc`` (None: gone meanwhile, or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        gid = None
        if gids:
            with open(f"/proc/{pid}/status", "rb") as f:
                gid = int(f.read().split(b"\nGid:", 1)[1].split()[0])
        return (parent if parent is not None else int(fields[1]), gid, fields[0] == b"Z")
    except (OSError, ValueError, IndexError):
        return None


def machine_table(gids: bool) -> dict[int, Row]:
    """Every process of the machine, by pid, read straight from ``/proc`` in one pass."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            row = _row(int(name), gids)
            if row is not None:
                table[int(name)] = row
    return table


def children_of(pid: int) -> list[int]:
    """``pid``'s children, from the kernel's list of each of its threads (a thread's
    list holds the children it forked); none where it is gone."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return found


def _kernel_lists_children() -> bool:
    """Whether the kernel keeps ``/proc/<pid>/task/<tid>/children`` (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


KEEPS_CHILDREN = _kernel_lists_children()


def family_table(roots: Iterable[int], gids: bool) -> dict[int, Row]:
    """Every process below ``roots`` (not the roots themselves), by pid, in the shape of
    :func:`machine_table`: the trees walked down from each root."""
    table: dict[int, Row] = {}
    todo = [(child, root) for root in dict.fromkeys(roots) for child in children_of(root)]
    while todo:
        pid, parent = todo.pop()
        if pid in table:
            continue
        row = _row(pid, gids, parent)
        if row is None:
            continue
        table[pid] = row
        todo.extend((child, pid) for child in children_of(pid))
    return table


def process_table(roots: Iterable[int], gids: bool, *, family: bool) -> dict[int, Row]:
    """The processes a worker's work can be in: the ``family`` below ``roots`` where it
    holds them all (this process is its workers' subreaper, and the kernel lists
    children), else the whole machine."""
    if family and KEEPS_CHILDREN:
        return family_table(roots, gids)
    return machine_table(gids)
