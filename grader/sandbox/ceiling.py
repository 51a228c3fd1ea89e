"""The grader's own memory ceiling while it checks what a submission returned.

A check holds data whose size the submission chooses: its replies (arrays, headers, text),
and whatever the check computes from them (a conversion to float64, a difference with the
expected array). Each source has its cap where it enters (the reply's bytes and elements,
the output kept, a figure's bytes and pixels, a notebook read in a child of its own), but
a computation the caps did not foresee can still ask for more than the machine has. On
Gradescope's 768 MB the kernel then kills the grader, and the student's page is the
placeholder "did not finish": no verdict at all.

So while the checks run, the grader's data segment (``RLIMIT_DATA``: its heap, the arrays
it allocates, its threads' stacks) may grow only so far above what it held when they
began. An allocation past it fails in the grader itself, as a ``MemoryError`` of the
check that asked for it (:mod:`grader.grading.suite` turns that into a failure that says
so), and the next check runs as usual. The limit is the soft one: every process the
grader starts (a fork server, a worker) lifts it before it runs (:func:`lift`), so
nothing but the grader itself is held to it.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

from grader.sandbox.confine import lift_data_ceiling as lift

__all__ = ["ACTIVE", "ceiling", "data_in_use", "lift"]

#: Whether a ceiling is set now (for the message of a check that ran into it).
ACTIVE: dict[str, int] = {}


def data_in_use() -> int | None:
    """This process's data segment now, in bytes (``VmData``), as the limit counts it."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@contextlib.contextmanager
def ceiling(headroom_bytes: int | None) -> Iterator[int | None]:
    """While the body runs, this process's data segment may grow by ``headroom_bytes``
    at most (None: no ceiling); yields the ceiling in bytes, None where none was set
    (the size could not be read, or the limit not lowered). The limit is restored after."""
    used = data_in_use() if headroom_bytes is not None else None
    if used is None or headroom_bytes is None:
        yield None
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = used + headroom_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield None  # a lower limit is set already (a TA's ulimit -d): it stays
        return
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (OSError, ValueError):
        yield None
        return
    ACTIVE["bytes"], ACTIVE["headroom"] = limit, headroom_bytes
    try:
        yield limit
    finally:
        ACTIVE.clear()
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
