"""System V IPC objects of a worker account, found and removed after its grading
(grader/sandbox/sysv.py): where no IPC namespace can be made, they would outlive it."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from grader.sandbox.sysv import owned_by, remove_ipc_objects

#: An account no process here runs as.
STRANGER = 54_321
IPC_PRIVATE, IPC_CREAT = 0, 0o1000


def test_objects_are_found_by_owner_or_creator(tmp_path: Path) -> None:
    (tmp_path / "shm").write_text(
        "       key      shmid perms       size  cpid  lpid nattch   uid   gid  cuid  cgid\n"
        "         0          7   600       4096    10    10      0  54321  100     0     0\n"
        "         0          8   600       4096    10    10      0     0    0  54321    0\n"
        "         0          9   600       4096    10    10      0     0    0     0     0\n"
    )
    (tmp_path / "sem").write_text("   key   semid perms   nsems   uid   gid  cuid  cgid\n")
    assert owned_by(STRANGER, "shm", tmp_path) == [7, 8]
    assert owned_by(STRANGER, "sem", tmp_path) == []
    assert owned_by(STRANGER, "msg", tmp_path) == []  # no table at all


@pytest.mark.skipif(os.geteuid() != 0, reason="making objects as another account needs root")
def test_a_workers_segment_queue_and_semaphores_are_removed() -> None:
    pid = os.fork()
    if pid == 0:  # the worker: three objects in this IPC namespace, then gone
        try:
            os.setgid(STRANGER)
            os.setuid(STRANGER)
            libc = ctypes.CDLL(None, use_errno=True)
            made = [
                libc.shmget(IPC_PRIVATE, ctypes.c_size_t(1 << 20), IPC_CREAT | 0o600),
                libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600),
                libc.semget(IPC_PRIVATE, 3, IPC_CREAT | 0o600),
            ]
            os._exit(0 if min(made) >= 0 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(owned_by(STRANGER, table) for table in ("shm", "msg", "sem"))
    assert remove_ipc_objects(STRANGER) == 3
    assert not any(owned_by(STRANGER, table) for table in ("shm", "msg", "sem"))
    assert remove_ipc_objects(STRANGER) == 0
