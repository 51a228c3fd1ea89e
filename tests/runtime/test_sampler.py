"""Timed and untimed requests look the same from the worker: the grader's memory sampler is
one thread for the worker's whole life (``usage.Sampler``), and every request is measured
the same way, whether it is timed or not (``WorkerClient._exchange``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from grader.runtime.client import WorkerClient
from grader.runtime.outcomes import SubmissionError
from grader.runtime.usage import Sampler, sampled
from grader.sandbox.sandbox import Sandbox
from grader.sandbox.view import VIEW_ENV
from tests.conftest import FAST_LIMITS, SOLUTION
from tests.runtime.test_timing import peak_growth_of_an_allocating_child


def _threads() -> int:
    return len(os.listdir(f"/proc/{os.getpid()}/task"))


def test_a_running_sampler_samples_every_body_without_a_thread_of_its_own() -> None:
    sampler = Sampler(interval_s=0.001)
    sampler.start()
    try:
        idle = _threads()
        calls: list[int] = []
        with sampled(lambda: calls.append(1) is None, 0.001, sampler):
            during = _threads()
            deadline = time.monotonic() + 5
            while len(calls) < 5 and time.monotonic() < deadline:
                time.sleep(0.005)
        assert len(calls) >= 5  # sampled in the body, by the sampler's thread
        assert during == idle  # and no thread came for the body
        after = len(calls)
        time.sleep(0.02)
        assert len(calls) == after  # nothing sampled between bodies
    finally:
        sampler.close()
    assert not sampler.alive


def test_without_a_sampler_a_body_gets_a_thread_of_its_own() -> None:
    """The fallback (a sampler not running) still samples, and its thread is gone after."""
    before = threading.active_count()
    calls: list[int] = []
    with sampled(lambda: calls.append(1) is None, 0.001, Sampler()):
        during = threading.active_count()
        time.sleep(0.02)
    assert calls and during == before + 1 and threading.active_count() == before


def test_rss_peak_through_the_sampler_sees_another_process_allocate() -> None:
    sampler = Sampler()
    sampler.start()
    try:
        assert peak_growth_of_an_allocating_child(sampler=sampler) >= 64 * 2**20
    finally:
        sampler.close()


def test_a_body_that_raises_leaves_the_sampler_serving() -> None:
    sampler = Sampler(interval_s=0.001)
    sampler.start()
    try:
        with contextlib.suppress(RuntimeError), sampled(lambda: True, 0.001, sampler):
            raise RuntimeError("the request failed")
        calls: list[int] = []
        with sampled(lambda: calls.append(1) is None, 0.001, sampler):
            time.sleep(0.02)
        assert calls
    finally:
        sampler.close()


#: A Part 1 module with a function that counts the grader's threads from the worker, as a
#: submission could (``/proc/<pid>/task`` is readable by every account), a while into the
#: request, once a sampler started for it would be running.
COUNTER = """

def grader_threads():
    import os, time
    time.sleep(0.05)
    try:
        return len(os.listdir("/proc/{pid}/task"))
    except OSError:
        return -1
"""


def _part1_client(sandbox: Sandbox) -> WorkerClient:
    sandbox.hand_over()
    return WorkerClient(
        part="part1",
        module_file="question1.py",
        submission_dir=str(sandbox.submission_dir),
        sandbox=sandbox,
        limits=FAST_LIMITS,
    )


def test_the_worker_sees_the_same_grader_threads_in_timed_and_untimed_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the worker's view shows the grader's ``/proc`` (no view of its own: a tree of
    its own mounts a ``/proc`` that hides it), its thread count says nothing."""
    monkeypatch.setenv(VIEW_ENV, "none")
    sandbox = Sandbox.create()
    try:
        module = sandbox.submission_dir / "question1.py"
        shutil.copy(SOLUTION / "question1.py", module)
        module.write_text(module.read_text() + COUNTER.format(pid=os.getpid()))
        client = _part1_client(sandbox)
        call = {"op": "call", "func": "grader_threads", "args": [], "kwargs": {}}
        seen: dict[bool, list[int]] = {True: [], False: []}
        for timed in (False, True) * 4:
            reply = client.request(call, what="grader_threads()", timed=timed)
            seen[timed].append(reply.header["result"]["value"])
            assert (reply.cpu_seconds is not None) == timed  # only a timed one keeps its figures
        client.stop()
    finally:
        sandbox.cleanup()
    assert min(seen[False] + seen[True]) > 0  # the worker could read them
    assert set(seen[True]) == set(seen[False]) and len(set(seen[True])) == 1, seen


def test_every_request_reads_the_workers_clocks_timed_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same reads before a request is sent, timed or not: its arrival is no later."""
    import grader.runtime.client as client_module

    reads: list[bool] = []
    real = client_module.cpu_reading
    timed_now = threading.local()

    def counted(*args):
        reads.append(timed_now.value)
        return real(*args)

    monkeypatch.setattr(client_module, "cpu_reading", counted)
    sandbox = Sandbox.create()
    try:
        shutil.copy(SOLUTION / "question1.py", sandbox.submission_dir / "question1.py")
        client = _part1_client(sandbox)
        call = {"op": "call", "func": "attention_flops", "args": [], "kwargs": {}}
        for timed in (True, False):
            timed_now.value = timed
            with contextlib.suppress(SubmissionError):  # a failed call is measured too
                client.request(call, what="attention_flops", timed=timed)
        client.stop()
    finally:
        sandbox.cleanup()
    assert reads.count(True) == reads.count(False) == 2


def test_the_sampler_lives_as_long_as_the_worker(tmp_path: Path) -> None:
    sandbox = Sandbox.create()
    try:
        shutil.copy(SOLUTION / "question1.py", sandbox.submission_dir / "question1.py")
        client = _part1_client(sandbox)
        call = {"op": "call", "func": "attention_flops", "args": [], "kwargs": {}}
        with contextlib.suppress(SubmissionError):
            client.request(call, what="attention_flops")
        assert client._sampler is not None and client._sampler.alive
        assert "sampler" in [t.name for t in threading.enumerate()]
        client.stop()
        assert client._sampler is None
        assert "sampler" not in [t.name for t in threading.enumerate()]  # gone with it
    finally:
        sandbox.cleanup()
