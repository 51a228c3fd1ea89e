"""System V IPC has no namespace of its own unless the worker gets one: shared memory,
message queues and semaphore sets a submission makes would outlive its grading, readable
by the next grading on the machine. As root the worker has an IPC namespace of its own,
and nothing it made survives it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.sandbox import forkserver

KEY = 0x4B5647  # the objects' key, so that the test can look for them afterwards

MAKES_IPC_OBJECTS = f"""import ctypes as _ct

_libc = _ct.CDLL(None, use_errno=True)
_libc.shmat.restype = _ct.c_void_p
for _i in range(2):  # two 64 MiB segments, touched so that they are resident
    _shm = _libc.shmget({KEY} + _i, 64 * 2**20, 0o1000 | 0o666)
    _at = _libc.shmat(_shm, None, 0)
    if _at not in (None, _ct.c_void_p(-1).value):
        _ct.memset(_at, 1, 64 * 2**20)
_q = _libc.msgget({KEY}, 0o1000 | 0o666)
_msg = _ct.create_string_buffer(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00secret answers", 32)
_libc.msgsnd(_q, _msg, 16, 0)
_libc.semget({KEY}, 3, 0o1000 | 0o666)

"""


def ipc_keys() -> set[int]:
    """The keys of every System V object this (the grader's) namespace holds."""
    keys = set()
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        keys |= {int(line.split()[0]) for line in lines if line.split()}
    return keys


@pytest.mark.skipif(os.geteuid() != 0, reason="an IPC namespace needs root")
@pytest.mark.parametrize("forked", ["1", "0"], ids=["forked", "started"])
def test_ipc_objects_do_not_outlive_the_worker(
    grade_patched, monkeypatch: pytest.MonkeyPatch, forked: str
) -> None:
    monkeypatch.setenv(forkserver.SWITCH, forked)
    ours = {KEY, KEY + 1}
    assert not ours & ipc_keys()  # nothing of an earlier run
    graded = grade_patched([("GIB = 2**30", MAKES_IPC_OBJECTS + "GIB = 2**30")])
    assert graded.score("1.1") == graded.test("1.1")["max_score"]  # the code ran and passed
    assert not ours & ipc_keys()
