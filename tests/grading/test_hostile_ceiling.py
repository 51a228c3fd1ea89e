"""Every grading ends in a verdict: a step that would take the grader past its memory stops
alone, says so, and the other checks are graded.

Each data whose size a submission controls has its cap where it enters the grader: a
reply's header and bytes (``test_hostile_io``, and in 768 MB ``test_hostile_memory``), its
arrays' elements (below), the output kept per request, a figure's bytes and pixels
(``test_hostile_io``, ``test_hostile_memory``), the notebook, read in a child with limits
of its own (``test_hostile_parse``). Behind them the grader's own ceiling
(``grader/sandbox/ceiling.py``) turns what the caps did not foresee into a failed check
instead of a grader the kernel kills.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from grader.grading.suite import MEMORY_STOP
from grader.parts.part1 import checks as part1_checks  # not its class: pytest would collect it
from grader.runtime import client as client_module
from grader.runtime.outcomes import SubmissionError
from grader.sandbox.forkserver import SWITCH
from grader.sandbox.sandbox import Sandbox
from tests.conftest import FAST_LIMITS, SOLUTION, grade_checks
from tests.grading.test_hostile_io import finishes_within, part1_client

MIB = 2**20


@pytest.mark.parametrize("fork_server", ["1", "0"], ids=["forked-workers", "started-workers"])
def test_a_check_past_the_graders_memory_fails_alone_and_the_rest_is_graded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork_server: str
) -> None:
    """1.2 asks for 512 MiB on top of its work, twice the ceiling's room: it fails with a
    message that says why, and 1.1 and 1.3, before and after it, keep their points. The
    workers (forked from a server started under the ceiling, or started themselves) are
    not held to it."""
    monkeypatch.setenv(SWITCH, fork_server)
    real = part1_checks.Part1Checks.test_weight_bytes

    @functools.wraps(real)
    def hungry(self: part1_checks.Part1Checks) -> None:
        held = np.ones(512 * MIB // 8)  # what a conversion no cap foresaw would ask for
        real(self)
        del held

    monkeypatch.setattr(part1_checks.Part1Checks, "test_weight_bytes", hungry)
    limits = replace(FAST_LIMITS, grader_headroom_bytes=256 * MIB)
    graded = grade_checks(SOLUTION, tmp_path / "out", "part1", {"1.1", "1.2", "1.3"}, limits)
    assert graded.score("1.2") == 0
    assert "The grader ran out of memory" in graded.output("1.2")
    assert "the other checks were graded" in graded.output("1.2")
    assert "Unable to allocate" in graded.test("1.2")["extra_data"][MEMORY_STOP]["error"]
    for number in ("1.1", "1.3"):
        assert graded.score(number) == graded.test(number)["max_score"], graded.output(number)


def test_the_same_check_is_graded_without_the_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check of the test above passes where the grader has the room: what stopped it
    was the ceiling, not the check."""
    real = part1_checks.Part1Checks.test_weight_bytes

    @functools.wraps(real)
    def hungry(self: part1_checks.Part1Checks) -> None:
        held = np.ones(64 * MIB // 8)
        real(self)
        del held

    monkeypatch.setattr(part1_checks.Part1Checks, "test_weight_bytes", hungry)
    limits = replace(FAST_LIMITS, grader_headroom_bytes=256 * MIB)
    graded = grade_checks(SOLUTION, tmp_path / "out", "part1", {"1.2"}, limits)
    assert graded.score("1.2") == graded.test("1.2")["max_score"], graded.output("1.2")


#: A Part 1 whose every reply (not the worker's first message, which has no id) carries
#: 40 MiB of bools: under the reply's byte limit, ten million numbers over its elements'.
BOOL_FLOOD = """
import sys
import numpy as np
_main = sys.modules["__main__"]
_real = _main.write_message

def _flood(fd, header, arrays=None, **kwargs):
    if "id" in header:
        arrays = {"flood": np.zeros(40 * 2**20, dtype=np.bool_)}
    return _real(fd, header, arrays, **kwargs)

_main.write_message = _flood

def attention_flops(*args, **kwargs):
    return 1
"""


def test_a_reply_of_more_numbers_than_the_grader_checks_is_refused() -> None:
    """A float64 copy of 40 MiB of bools would be 320 MiB in the grader: the reply is
    refused before any check converts it, and the worker is stopped."""
    sandbox = Sandbox.create()
    try:
        (sandbox.submission_dir / "question1.py").write_text(BOOL_FLOOD)
        client = part1_client(sandbox, FAST_LIMITS)
        call = {"op": "call", "func": "attention_flops", "args": [], "kwargs": {}}
        with pytest.raises(SubmissionError) as info:
            finishes_within(120, client.request, call, what="attention_flops(N)")
        assert not client.running
        client.stop()
    finally:
        sandbox.cleanup()
    assert info.value.kind == "protocol"
    assert "numbers, more than the" in str(info.value)


def test_a_reply_the_grader_has_no_memory_left_for_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ceiling met half-way through a reply: the check is told, and the worker, whose
    channel is out of step now, is stopped, so the next request starts a fresh one."""
    sandbox = Sandbox.create()
    try:
        (sandbox.submission_dir / "question1.py").write_text("def attention_flops(): return 1\n")
        client = part1_client(sandbox, FAST_LIMITS)
        call = {"op": "call", "func": "attention_flops", "args": [], "kwargs": {}}
        client.request(call, what="attention_flops(N)")  # started
        real = client_module.read_message

        def no_memory(*args, **kwargs):
            raise MemoryError

        monkeypatch.setattr(client_module, "read_message", no_memory)
        with pytest.raises(SubmissionError) as info:
            client.request(call, what="attention_flops(N)")
        assert not client.running
        monkeypatch.setattr(client_module, "read_message", real)
        assert client.request(call, what="attention_flops(N)").header["ok"]
        client.stop()
    finally:
        sandbox.cleanup()
    assert info.value.kind == "protocol"
    assert "no memory left to read your code's reply" in str(info.value)
