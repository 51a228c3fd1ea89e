"""The grader's memory ceiling: an allocation past it fails in the grader as a
``MemoryError``, the limit is restored after, and nothing the grader starts is held to it."""

from __future__ import annotations

import subprocess
import sys

#: In a child (the test runner keeps its own limits): a ceiling of 64 MiB over what the
#: child holds, then 256 MiB asked for inside it, by this process and by a process it
#: starts as the grader starts its fork servers (``preexec_fn=lift``); then the same
#: allocation after the ceiling. Prints what happened to each.
PROBE = """
import resource, subprocess, sys
import numpy as np
from grader.sandbox.ceiling import ACTIVE, ceiling, lift
ALLOCATE = "import numpy as np; a = np.ones(256 * 2**20 // 8); print(int(a.sum()))"
def allocate():
    try:
        return str(int(np.ones(256 * 2**20 // 8).sum()))
    except MemoryError:
        return "MemoryError"
def child(**kwargs):
    out = subprocess.run([sys.executable, "-c", ALLOCATE], capture_output=True, text=True,
                         **kwargs)
    return out.stdout.strip() or "failed"
before = resource.getrlimit(resource.RLIMIT_DATA)
with ceiling({headroom}) as limit:
    seen = [allocate(), child(preexec_fn=lift), child(), str(bool(ACTIVE))]
seen += [allocate(), str(resource.getrlimit(resource.RLIMIT_DATA) == before), str(bool(ACTIVE))]
print(limit is not None, *seen)
"""


def probe(headroom: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(headroom=headroom)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_an_allocation_past_the_ceiling_fails_in_the_grader_alone() -> None:
    limit, inside, lifted, inherited, active, after, restored, left = probe("64 * 2**20")
    assert limit == "True" and active == "True"
    assert inside == "MemoryError"  # the grader's own allocation
    assert lifted == str(256 * 2**20 // 8)  # a process it starts lifts the ceiling first
    assert inherited == "failed"  # which a process that does not lift it would meet
    assert after == str(256 * 2**20 // 8) and restored == "True" and left == "False"


def test_no_ceiling_holds_nothing() -> None:
    limit, inside, *_ = probe("None")
    assert limit == "False" and inside == str(256 * 2**20 // 8)
