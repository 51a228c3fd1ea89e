"""What the parent measures of a worker during one request, read from outside: its CPU
clock before and after, and its memory sampled while it runs.

Every request is measured the same way, timed or not (``WorkerClient._exchange``), and
only a timed one keeps the figures (:func:`figures`): the worker cannot tell them apart by
the grader's threads, its reads of the worker's clocks, or when the request arrives.
"""

from __future__ import annotations

import contextlib
from typing import Any

from grader.runtime.gpu_memory import Usage, gpu_peak
from grader.runtime.usage import Sampler, cpu_snapshot, cpu_used, rss_peak
from grader.sandbox.cgroups import CpuGroup


def cpu_reading(
    group: CpuGroup | None, pid: int, run_gid: int | None, server_pid: int | None
) -> Any:
    """The worker's CPU clock now: its cgroup's counter where it has one, else a snapshot
    of its processes and of what its reapers (its fork server) reaped (:func:`cpu_snapshot`)."""
    if group is not None:
        return group.usage_s()
    return cpu_snapshot(pid, run_gid, reapers=(server_pid,) if server_pid else ())


def cpu_between(group: CpuGroup | None, before: Any, after: Any) -> float | None:
    """The CPU seconds between two :func:`cpu_reading`; None where one could not be read."""
    if group is not None:
        if before is None or after is None:
            return None
        return max(0.0, after - before)
    return cpu_used(before, after)


def memory_sampled(
    pid: int, device: str, sampler: Sampler | None, gpu: Usage | None = None
) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """The worker's memory, sampled by ``sampler`` (the thread of the worker's whole life)
    while a request runs: its RSS on a CPU; on a GPU what ``gpu`` (NVML's reader) says its
    processes hold."""
    if device == "cuda":
        return gpu_peak(pid, gpu, sampler=sampler)
    return rss_peak(pid, sampler=sampler)


def figures(
    reply: dict[str, Any],
    held: dict[str, Any],
    cpu: float | None,
    seconds: float,
    device: str,
    timed: bool,
) -> dict[str, Any]:
    """A request's figures for its ``Reply``: its seconds, and for a ``timed`` one the CPU
    seconds, the peak memory (RSS growth on a CPU, else the worker's own report, validated)
    and on a GPU the memory NVML saw its processes hold; None where not kept."""
    rss, gpu = (None, held) if device == "cuda" else (held, None)
    if not timed:
        rss = gpu = cpu = None
    peak, source = reply.get("cuda_peak_bytes") if timed else None, "worker"
    if not isinstance(peak, int) or isinstance(peak, bool) or peak < 0:
        peak = None  # the worker's own report is data like any other: validated
    if rss is not None and rss["start"]:
        peak, source = max(0, rss["peak"] - rss["start"]), "rss"
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_bytes": peak,
        "peak_source": source if peak is not None else None,
        "gpu_held_bytes": gpu["peak"] if gpu is not None else None,
    }
