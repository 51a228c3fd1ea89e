"""What a worker's processes used during a request, read from outside: the CPU time the
kernel charged them and their peak RSS (a submission cannot forge either)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import psutil

from grader.runtime.process_table import process_table
from grader.sandbox.processes import STARTED, is_subreaper


def _threads_cpu(pid: int) -> float:
    """CPU seconds of the live threads of ``pid`` to the nanosecond (``schedstat``); 0.0
    where the kernel does not expose it."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _process_cpu(process: psutil.Process, reaped: bool) -> float:
    """CPU seconds charged to one process: the larger of its ``stat`` figure (every
    thread, exited ones included, in 10 ms ticks) and the sum over its live threads to
    the nanosecond; with ``reaped``, plus the children it has waited for."""
    t = process.cpu_times()
    own = max(t.user + t.system, _threads_cpu(process.pid))
    return own + (t.children_user + t.children_system if reaped else 0.0)


def _descendants(children: dict[int, list[int]], root: int) -> list[int]:
    """The pids below ``root`` in the tree ``children`` (parent -> its children)."""
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_snapshot(
    pid: int, run_gid: int | None = None, reapers: Sequence[int] = ()
) -> dict[int, float] | None:
    """CPU seconds the kernel has charged so far to process ``pid`` (all its threads and
    the children it has reaped) and to each of its live descendants, by pid. None if the
    worker cannot be read.

    With ``run_gid`` (the grading's own group id, which a worker cannot leave: it runs
    with no new privileges), every live process of that group counts too, so work handed
    to a daemon that left the worker's process tree is still charged to the worker. So
    does every orphan that exited under this process, the workers' subreaper
    (``become_subreaper``): its CPU time is read before it is reaped.

    Every live descendant counts the children it has reaped, so a helper that waits for
    its own children hides nothing. ``reapers`` (the fork server that forked the worker)
    count only the children they reaped, under their negated pid: a helper the worker
    made a sibling of itself (``clone(CLONE_PARENT)``) is reaped there. This is the
    fallback where the worker has no cgroup (:mod:`grader.sandbox.cgroups`). Every request
    takes two, timed or not, so only the processes that can hold the worker's work are
    read, in one pass: below this process and the reapers where this process is its
    workers' subreaper, else every process of the machine
    (:mod:`grader.runtime.process_table`)."""
    try:
        out = {pid: _process_cpu(psutil.Process(pid), reaped=True)}
    except psutil.Error:
        return None
    roots = (os.getpid(), pid, *reapers)
    table = process_table(roots, gids=run_gid is not None, family=is_subreaper())
    children: dict[int, list[int]] = {}
    for child, (parent, *_) in table.items():
        children.setdefault(parent, []).append(child)

    def count(pids: Iterable[int], reaped: bool) -> None:
        for other in pids:
            if other not in out:
                with contextlib.suppress(psutil.Error):
                    out[other] = _process_cpu(psutil.Process(other), reaped=reaped)

    count(_descendants(children, pid), reaped=True)
    keep = {*STARTED, pid}  # descendants that exited, reaped by no one yet
    mine = children.get(os.getpid(), ())
    count((c for c in mine if c not in keep and table[c][2]), reaped=False)
    for reaper in reapers:  # what it reaped, and its children it has not reaped yet
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(reaper).cpu_times()
            out[-reaper] = t.children_user + t.children_system
            count(_descendants(children, reaper), reaped=True)
    if run_gid is not None:
        count((o for o, row in table.items() if row[1] == run_gid), reaped=False)
    return out


def cpu_used(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    """The CPU seconds the worker's processes used between two snapshots. A process
    that vanished in between adds nothing, and none subtracts: CPU time only grows, so
    no process can make the figure smaller than the work it did while it was seen."""
    if before is None or after is None:
        return None
    return sum(max(0.0, used - before.get(pid, 0.0)) for pid, used in after.items())


class Sampler:
    """One thread that samples for a worker's whole life, during every request.

    A thread started for a request and gone after it would show the worker when it is
    timed: the grader's ``/proc/<pid>/task`` is readable by every account. This one is
    started with the worker and stopped with it, whatever its requests are, so the
    grader's thread count is the same during all of them (see :class:`WorkerClient`).
    Its ``take`` functions are called under one lock, every ``interval_s`` while a
    :func:`sampled` body runs.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._takes: list[list[Callable[[], bool]]] = []  # one slot per body running
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True, name="sampler")
            self._thread.start()

    def close(self) -> None:
        """Stop the thread and wait for it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and not self._closed

    def _serve(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._takes:
                    self._cond.wait()
                    continue
                self._cond.wait(self.interval_s)
                for slot in self._takes:
                    slot[:] = [take for take in slot if take()]

    @contextmanager
    def during(self, take: Callable[[], bool]) -> Iterator[None]:
        """Call ``take`` every interval while the body runs (until it returns False)."""
        slot = [take]
        with self._cond:
            self._takes.append(slot)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:  # not mid-sample: the last take below is the last one
                self._takes.remove(slot)


@contextmanager
def sampled(
    take: Callable[[], bool], interval_s: float, sampler: Sampler | None = None
) -> Iterator[None]:
    """Call ``take`` every ``interval_s`` in a thread while the body runs (until it returns
    False), and once more after the body: the samplers of peak memory. With a running
    ``sampler``, its thread does it (at its own interval); else a thread of the body's own."""
    if sampler is not None and sampler.alive:
        try:
            with sampler.during(take):
                yield
        finally:
            take()
        return
    done = threading.Event()

    def loop() -> None:
        while not done.wait(interval_s) and take():
            pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        take()


@contextmanager
def rss_peak(
    pid: int, interval_s: float = 0.005, sampler: Sampler | None = None
) -> Iterator[dict[str, int]]:
    """Sample the RSS of process ``pid`` in a thread while the body runs; the dict holds
    ``start`` and ``peak`` in bytes (both 0 if the process cannot be read).

    A coarse interval keeps the sampler's own CPU use negligible (it shares the
    machine with the worker it measures); an allocation shorter than the
    interval can be missed, which only ever makes the growth look smaller.
    """
    try:
        process = psutil.Process(pid)
        start = process.memory_info().rss
    except psutil.Error:
        yield {"start": 0, "peak": 0}
        return
    stats = {"start": start, "peak": start}

    def take() -> bool:
        try:
            stats["peak"] = max(stats["peak"], process.memory_info().rss)
        except psutil.Error:
            return False
        return True

    with sampled(take, interval_s, sampler):
        yield stats
