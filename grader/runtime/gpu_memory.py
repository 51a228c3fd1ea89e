"""Peak GPU memory of the worker, read by the grader through NVML.

The worker could report its own peak (``torch.cuda.max_memory_allocated``), but the
submission runs in that process: it can patch the function or reset the counter
mid-request. NVML's per-process accounting is the driver's, out of the submission's
reach, so on a GPU the parent samples the memory the worker's processes hold while a
timed request runs, and shows it beside the worker's own figure. It counts all the
process holds: its CUDA context, and PyTorch's cached blocks, which the worker keeps
from one request to the next (handing them back would add allocations to every timed
run), so it is the most the process has held so far rather than one request's own, and
reads far higher than PyTorch's figure. A sample every few milliseconds can miss an
allocation held for less than that: a submission can hide only memory it holds that
briefly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import psutil

from grader.runtime.usage import Sampler, sampled

#: GPU memory in bytes per process id, summed over every GPU of the machine.
Usage = Callable[[], Mapping[int, int]]


@functools.cache
def nvml_usage() -> Usage | None:
    """A reader of NVML's per-process GPU memory; None where NVML cannot be used (no
    ``pynvml``, no NVIDIA driver, a machine without a GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # ImportError, or any NVMLError (library or driver absent)
        return None

    def read() -> dict[int, int]:
        used: dict[int, int] = {}
        for handle in handles:
            try:
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            for p in processes:  # usedGpuMemory is None where the driver withholds it
                if isinstance(p.usedGpuMemory, int):
                    used[p.pid] = used.get(p.pid, 0) + p.usedGpuMemory
        return used

    return read


def tree_bytes(usage: Mapping[int, int], pids: set[int]) -> int | None:
    """The GPU memory ``pids`` hold together; None when NVML lists none of them (it
    cannot see them: another PID namespace, or no memory on any GPU yet)."""
    held = [used for pid, used in usage.items() if pid in pids]
    return sum(held) if held else None


def process_tree(pid: int) -> set[int]:
    """``pid`` and its live descendants."""
    try:
        return {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    except psutil.Error:
        return {pid}


@contextmanager
def gpu_peak(
    pid: int, read: Usage | None, interval_s: float = 0.005, sampler: Sampler | None = None
) -> Iterator[dict[str, int | None]]:
    """Sample the GPU memory of ``pid``'s process tree in a thread while the body runs
    (``sampler``'s, where given); the dict's ``peak`` is the most seen, in bytes (None:
    NVML never listed the tree)."""
    stats: dict[str, int | None] = {"peak": None}
    if read is None:
        yield stats
        return
    pids, taken = process_tree(pid), 0

    def take() -> bool:
        nonlocal pids, taken
        taken += 1
        if taken % 50 == 0:  # a process the worker started since
            pids = process_tree(pid)
        try:
            held = tree_bytes(read(), pids)
        except Exception:  # NVML errors mid-run: this sample is lost, not the grading
            return True
        if held is not None:
            stats["peak"] = held if stats["peak"] is None else max(stats["peak"], held)
        return True

    take()
    with sampled(take, interval_s, sampler):
        yield stats
