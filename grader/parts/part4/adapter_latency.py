"""Part 4 adapter: the student's ``measure_latency`` run and timed (the worker's module
``adapter_part4_latency``): with a one-off delay in its first model call, and with every
generation it runs timed on the adapter's own clock. ``on`` is the grading device
(default: the worker's). Everything returned is raw data: the parent judges it.

No clock of the submission's is replaced: the lab may read any clock, taken in any way.
The adapter's own clocks and sleep are taken here, when the worker imports this module,
before the submission is imported: wall time (``perf_counter``) and, beside it at every
event of ``latency_timed``, the process's and the thread's CPU time, so that the parent
can say which clock a lab's figures were read on (a grader's wait is wall time and
almost no CPU time)."""

from __future__ import annotations

import threading
import time
from typing import Any

if __package__:
    from grader.parts.part4.adapter_device import device, sync
else:
    from adapter_part4_device import device, sync

_now = time.perf_counter  # the adapter's clock, whatever the lab later does to `time`
_cpu = time.process_time  # the process's CPU time, every thread's
_thread = time.thread_time  # the calling thread's CPU time
_ident = threading.get_ident
_sleep = time.sleep
MAX_EVENTS = 20_000  # model calls (and generate calls) recorded, at most
#: Events past which the CPU times are left out of the reply (its header holds 1 MiB):
#: the wall clock's record alone is judged then, and no clock named.
MAX_CPU_EVENTS = 4_000
CPU_DIGITS = 7  # CPU times in the reply to 0.1 us, well inside the parent's 20 us a run
MODES = {"no_cache": "generate_no_cache", "cache": "generate_with_cache"}


def run_latency(
    mod: Any, model: Any, request: dict[str, Any], on: str | None = None
) -> dict[str, Any]:
    """The student's ``measure_latency`` on ``model``, with a one-off delay of
    ``first_call_delay_s`` in the very first model call it makes: a warm-up run absorbs
    it, a timed run shows it. Returns what ``measure_latency`` returned."""
    from values import encode_value

    delay = float(request["first_call_delay_s"])
    original = model.forward
    calls = [0]

    def delayed(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            _sleep(delay)
        return original(*args, **kwargs)

    model.forward = delayed
    try:
        result = mod.measure_latency(
            model,
            tuple(request["L_values"]),
            prompt_len=request["prompt_len"],
            warmup=request["warmup"],
            repeats=request["repeats"],
            device=on or device(),
        )
        sync()
    finally:
        del model.forward
    return {"result": encode_value(result), "forward_calls": calls[0]}


def _shape_of(value: Any) -> tuple[int, int]:
    """(rows, tokens) of a (B, T) tensor of ids; -1 for what is not one."""
    shape = tuple(getattr(value, "shape", ()))
    if len(shape) != 2:
        return -1, int(shape[-1]) if shape else -1
    return int(shape[0]), int(shape[1])


def _cpu_now() -> list[float]:
    """The process's and the thread's CPU time now, in seconds."""
    return [_cpu(), _thread()]


class _Recorder:
    """Records, on the adapter's clock, every model call and every generate call a
    ``measure_latency`` makes (and, beside each, the process's and the thread's CPU time
    when it began and ended: ``calls_cpu`` and ``generations_cpu``, a row of ``[process
    at start, process at end, thread at start, thread at end]`` per row of ``calls`` and
    ``generations``), and makes each generation wait a known time inside it:
    ``waits[(2 k + cached) % len]`` for the mode's k-th generation (the modes take turns
    along the list). A generation is a call of the module's generate function (read
    through its global name) or, where none is made, a run of model calls that starts
    with exactly ``prompt_len`` tokens: there the wait is in its second call, when its
    mode shows (one token fed with the cache, the whole sequence without)."""

    def __init__(self, prompt_len: int, waits: list[float]) -> None:
        self.prompt_len, self.waits = prompt_len, waits
        self.began, self.began_cpu = _now(), _cpu_now()
        self.calls: list[list[Any]] = []  # [t0, t1, tokens, rows, waited, generate call or -1]
        self.generations: list[list[Any]] = []  # [mode, L, t0, t1, rows, tokens, waited]
        self.calls_cpu: list[list[float]] = []  # [process t0, t1, thread t0, t1] per call
        self.generations_cpu: list[list[float]] = []  # the same per generation
        self.runs = {"no_cache": 0, "cache": 0}
        self.threads = {_ident()}  # where events ran: thread times compare within one
        self.inside: int | None = None  # the generate call under way
        self.run_calls: int | None = None  # model calls so far of a generation found by them

    def wait(self, mode: str) -> float:
        k = self.runs[mode]
        self.runs[mode] = k + 1
        seconds = self.waits[(2 * k + (mode == "cache")) % len(self.waits)]
        _sleep(seconds)
        return seconds

    def model_call(self, original: Any, args: tuple, kwargs: dict) -> Any:
        rows, tokens = _shape_of(args[0] if args else kwargs.get("input_ids"))
        c0 = _cpu_now()
        t0, waited = _now(), 0.0
        if self.inside is None:
            if tokens == self.prompt_len:
                self.run_calls = 0
            elif self.run_calls is not None:
                self.run_calls += 1
            if self.run_calls == 1:
                waited = self.wait("cache" if tokens == 1 else "no_cache")
        try:
            return original(*args, **kwargs)
        finally:
            t1, c1 = _now(), _cpu_now()
            if len(self.calls) < MAX_EVENTS:
                owner = -1 if self.inside is None else self.inside
                self.calls.append([t0 - self.began, t1 - self.began, tokens, rows,
                                   waited, owner])  # fmt: skip
                self.calls_cpu.append(self.cpu_row(c0, c1))

    def generate_call(self, mode: str, original: Any, args: tuple, kwargs: dict) -> Any:
        if self.inside is not None or len(self.generations) >= MAX_EVENTS:
            return original(*args, **kwargs)  # one generate function calling the other
        L = args[2] if len(args) > 2 else kwargs.get("L")
        L = L if isinstance(L, int) and not isinstance(L, bool) else -1
        rows, tokens = _shape_of(args[1] if len(args) > 1 else kwargs.get("input_ids"))
        self.inside = len(self.generations)
        c0 = _cpu_now()
        t0 = _now()
        waited = self.wait(mode)
        try:
            return original(*args, **kwargs)
        finally:
            t1, c1 = _now(), _cpu_now()
            self.inside = None
            self.generations.append(
                [mode, L, t0 - self.began, t1 - self.began, rows, tokens, waited]
            )
            self.generations_cpu.append(self.cpu_row(c0, c1))

    def cpu_row(self, c0: list[float], c1: list[float]) -> list[float]:
        """``[process at start, at end, thread at start, at end]`` since the record began."""
        self.threads.add(_ident())
        (p, t), (p0, t0), (p1, t1) = self.began_cpu, c0, c1
        return [round(x, CPU_DIGITS) for x in (p0 - p, p1 - p, t0 - t, t1 - t)]


def run_latency_timed(
    mod: Any, model: Any, request: dict[str, Any], on: str | None = None
) -> dict[str, Any]:
    """The student's ``measure_latency`` with every model call and generate call it makes
    recorded on the adapter's clock (see :class:`_Recorder`): what it returned, the
    calls, and when it returned. The lab's clock is left alone; the parent bounds what
    each generation's time can be on any clock from the times around it. ``args`` are
    the keyword arguments passed (none: the defaults); ``waits_s`` the waits by place."""
    from values import encode_value

    rec = _Recorder(int(request["prompt_len"]), [float(x) for x in request["waits_s"]])
    original = model.forward
    originals = {mode: getattr(mod, name, None) for mode, name in MODES.items()}

    def wrapped(mode: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            return rec.generate_call(mode, originals[mode], args, kwargs)

        return call

    model.forward = lambda *args, **kwargs: rec.model_call(original, args, kwargs)
    try:
        for mode, name in MODES.items():
            if callable(originals[mode]):
                setattr(mod, name, wrapped(mode))
        result = mod.measure_latency(
            model, tuple(request["L_values"]), **request["args"], device=on or device()
        )
        sync()
        ended, (process, thread) = _now() - rec.began, _cpu_now()
        ended_cpu = [round(process - rec.began_cpu[0], CPU_DIGITS),
                     round(thread - rec.began_cpu[1], CPU_DIGITS)]  # fmt: skip
    finally:
        for mode, name in MODES.items():
            if callable(originals[mode]):
                setattr(mod, name, originals[mode])
        del model.forward
    reply = {"result": encode_value(result), "calls": rec.calls,
             "generations": rec.generations, "ended": ended}  # fmt: skip
    if len(rec.calls) + len(rec.generations) <= MAX_CPU_EVENTS:
        reply |= {"calls_cpu": rec.calls_cpu, "generations_cpu": rec.generations_cpu,
                  "ended_cpu": ended_cpu, "threads": len(rec.threads)}  # fmt: skip
    return reply
