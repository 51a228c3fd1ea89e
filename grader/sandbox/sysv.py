"""System V IPC objects a worker account left behind, removed after its grading.

As root with ``CAP_SYS_ADMIN`` each worker has an IPC namespace of its own
(:func:`grader.sandbox.confine.unshare_ipc`), and its segments, queues and semaphore sets
vanish with its last process. A default Docker container refuses that namespace: there the
worker's objects live in the container's namespace, and would outlive the grading
(shared memory that holds memory, readable by a later grading). The grader removes
every object the worker account owns or made once its processes are gone (as that
account: without ``CAP_SYS_ADMIN`` only an owner may), as it removes the files it left in
the shared temporary folders.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

IPC_RMID = 0
#: Each kind of object: its table in ``/proc/sysvipc``, and how one is removed by id.
TABLES = ("shm", "msg", "sem")


def owned_by(uid: int, table: str, folder: Path = Path("/proc/sysvipc")) -> list[int]:
    """The ids of the objects in ``table`` ("shm", "msg" or "sem") that ``uid`` owns or
    created (owner and creator columns)."""
    try:
        lines = (folder / table).read_text().splitlines()
    except OSError:
        return []
    if not lines:
        return []
    header = lines[0].split()
    columns = [header.index(name) for name in ("uid", "cuid")]
    ids = []
    for line in lines[1:]:
        fields = line.split()
        with contextlib.suppress(ValueError, IndexError):
            if any(int(fields[c]) == uid for c in columns):
                ids.append(int(fields[1]))
    return ids


def _remove(table: str, ident: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if table == "shm":
        done = libc.shmctl(ident, IPC_RMID, None)
    elif table == "msg":
        done = libc.msgctl(ident, IPC_RMID, None)
    else:
        done = libc.semctl(ident, 0, IPC_RMID)
    return done == 0


def remove_ipc_objects(uid: int) -> int:
    """Remove every System V segment, queue and semaphore set of ``uid`` in this IPC
    namespace; return how many (0 where the worker had a namespace of its own).

    Removing another account's object takes ``CAP_SYS_ADMIN``, which a default Docker
    container lacks, so a child that becomes ``uid`` (an object's owner may remove it)
    does it."""
    found = [(table, ident) for table in TABLES for ident in owned_by(uid, table)]
    if not found:
        return 0
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setuid(uid)
            os._exit(min(sum(_remove(table, ident) for table, ident in found), 255))
        except BaseException:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return max(os.waitstatus_to_exitcode(status), 0)
