"""grader/runtime/gpu_memory.py: the worker's GPU memory, read by the parent (NVML).

NVML itself needs an NVIDIA driver: here the sampler runs against a stand-in reader
with the same contract (bytes per process id), over real processes; the reading of a
real GPU is covered where one is present (``test_nvml_sees_this_process_on_a_gpu``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from grader.runtime.gpu_memory import gpu_peak, process_tree, tree_bytes


def test_tree_bytes_counts_only_the_workers_processes() -> None:
    usage = {10: 100, 11: 50, 99: 7_000}  # 99: another grading on the same GPU
    assert tree_bytes(usage, {10, 11, 12}) == 150
    assert tree_bytes(usage, {12}) is None  # NVML does not list it: unknown, not zero
    assert tree_bytes({}, {10}) is None


def test_the_process_tree_holds_the_children_a_worker_starts() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
         "'import time; time.sleep(30)']); time.sleep(30)"]
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while len(process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(parent.pid)
        assert parent.pid in tree and len(tree) == 2
    finally:
        for pid in process_tree(parent.pid) - {parent.pid}:
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.kill()
        parent.wait()


def test_the_peak_is_the_most_the_tree_held_while_the_body_ran() -> None:
    """A stand-in for NVML whose figure for this process rises, peaks and falls during
    the body: the sampler keeps the peak, never another process's memory."""
    from os import getpid

    me, readings = getpid(), iter([1_000, 5_000, 9_000, 4_000])
    last = {"held": 0}

    def read() -> dict[int, int]:
        last["held"] = next(readings, last["held"])
        return {me: last["held"], 1: 10**12}  # pid 1: not ours, however large

    with gpu_peak(me, read, interval_s=0.001) as stats:
        time.sleep(0.2)
    assert stats["peak"] == 9_000


def test_nothing_listed_or_no_nvml_reads_as_unknown() -> None:
    from os import getpid

    with gpu_peak(getpid(), lambda: {1: 10**9}, interval_s=0.001) as stats:
        time.sleep(0.02)
    assert stats["peak"] is None
    with gpu_peak(getpid(), None) as stats:
        pass
    assert stats["peak"] is None

    def broken() -> dict[int, int]:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    with gpu_peak(getpid(), broken, interval_s=0.001) as stats:  # a sample lost, not the run
        time.sleep(0.02)
    assert stats["peak"] is None


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_timed_request_names_where_its_peak_was_read(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the parent reads what the driver saw the worker's processes hold (a
    stand-in for NVML here) beside the worker's own CUDA peak; where NVML lists no process
    of the worker that figure is unknown, never zero. On a CPU the peak is the RSS growth,
    read by the parent, and nothing is read from NVML."""
    import shutil

    from grader.runtime import client as client_module
    from grader.runtime.client import WorkerClient
    from grader.sandbox.sandbox import Sandbox
    from tests.conftest import FAST_LIMITS, SOLUTION

    held: dict[str, WorkerClient] = {}
    listed = {"worker": True}

    def read() -> dict[int, int]:
        proc = held["client"]._proc
        return {proc.pid: 42 * 2**20} if proc is not None and listed["worker"] else {}

    monkeypatch.setattr(client_module, "nvml_usage", lambda: read)
    sandbox = Sandbox.create()
    try:
        shutil.copy(SOLUTION / "question1.py", sandbox.submission_dir / "question1.py")
        sandbox.hand_over()
        held["client"] = client = WorkerClient(
            part="part1", module_file="question1.py", submission_dir=str(sandbox.submission_dir),
            sandbox=sandbox, limits=FAST_LIMITS, device=device,
        )  # fmt: skip
        call = {"op": "call", "func": "attention_flops", "args": [64, 8, "prefill"], "kwargs": {}}
        client.request(call, what="attention_flops", timed=False)  # started, warm
        reply = client.request(call, what="attention_flops", timed=True)
        listed["worker"] = False
        unseen = client.request(call, what="attention_flops", timed=True)
        client.stop()
    finally:
        sandbox.cleanup()
    if device == "cuda":
        assert reply.gpu_held_bytes == 42 * 2**20
        assert reply.sample().gpu_held_bytes == 42 * 2**20
        assert unseen.gpu_held_bytes is None
        # The worker put nothing on a GPU, so it reports no CUDA peak either: unknown.
        assert (reply.peak_bytes, reply.peak_source) == (None, None)
    else:
        assert reply.peak_source == "rss" and reply.peak_bytes is not None
        assert reply.gpu_held_bytes is None
