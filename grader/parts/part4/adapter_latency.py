"""Part 4 adapter: the student's ``measure_latency`` driven (the worker's module
``adapter_part4_latency``): with a one-off delay in its first model call, with its
generate functions counted, or with every standard clock replaced by one the parent
can predict. ``on`` is the grading device (default: the worker's). Everything returned
is raw data: the parent judges it."""

from __future__ import annotations

import time
from typing import Any

if __package__:
    from grader.parts.part4.adapter_device import device, sync
else:
    from adapter_part4_device import device, sync


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
            time.sleep(delay)
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


def run_latency_runs(
    mod: Any, model: Any, request: dict[str, Any], on: str | None = None
) -> dict[str, Any]:
    """The student's ``measure_latency`` with the module's two generate functions counted:
    the ``L`` of every call, per mode, in order (-1 where no int ``L`` was passed). How
    the generate functions work does not matter, only how often they run."""
    calls: dict[str, list[int]] = {"no_cache": [], "cache": []}
    originals = {"no_cache": mod.generate_no_cache, "cache": mod.generate_with_cache}

    def counting(mode: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            L = args[2] if len(args) > 2 else kwargs.get("L")
            calls[mode].append(L if isinstance(L, int) and not isinstance(L, bool) else -1)
            return originals[mode](*args, **kwargs)

        return call

    try:
        mod.generate_no_cache, mod.generate_with_cache = counting("no_cache"), counting("cache")
        mod.measure_latency(
            model, tuple(request["L_values"]), prompt_len=request["prompt_len"],
            warmup=request["warmup"], repeats=request["repeats"], device=on or device(),
        )  # fmt: skip
        sync()
    finally:
        mod.generate_no_cache, mod.generate_with_cache = originals["no_cache"], originals["cache"]
    return {"calls": calls}


#: The clocks a lab may time with: each is driven while ``measure_latency`` runs.
DRIVEN_CLOCKS = (
    "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns",
)  # fmt: skip
#: The process's CPU-time clocks: driven too, but they miss the time a run spends outside
#: the process's computing (the driven clock's extra per generation), as CPU time does.
#: The course's lab asks for latency, so figures read from them are the wrong ones.
CPU_CLOCKS = ("process_time", "process_time_ns")


def _clock_places(mod: Any, state: dict[str, Any]) -> tuple[list, dict[int, Any]]:
    """Where the lab can reach a standard clock (the ``time`` module, ``timeit``'s default
    timer, aliases in ``mod``) with the real clock found there, and the driven stand-in
    of each real clock (by id): ``state["now"]`` in seconds, or in ns for ``*_ns``;
    ``state["cpu"]`` for the CPU-time clocks (``CPU_CLOCKS``)."""
    import time as clock_module
    import timeit

    reals = {name: getattr(clock_module, name) for name in DRIVEN_CLOCKS + CPU_CLOCKS}

    def stand_in(name: str) -> Any:
        key = "cpu" if name in CPU_CLOCKS else "now"
        if name.endswith("_ns"):
            return lambda: round(state[key] * 1e9)
        return lambda: state[key]

    fakes = {id(real): stand_in(name) for name, real in reals.items()}
    places = [(clock_module, name) for name in reals] + [(timeit, "default_timer")]
    places += [(mod, name) for name in list(vars(mod))]
    saved = [
        (obj, name, value) for obj, name in places if id(value := getattr(obj, name, None)) in fakes
    ]
    return saved, fakes


def run_latency_clock(
    mod: Any, model: Any, request: dict[str, Any], on: str | None = None
) -> dict[str, Any]:
    """The student's ``measure_latency`` with every standard wall clock
    (``time.perf_counter``, ``monotonic``, ``time``, their ``_ns`` forms, ``timeit``'s
    default timer and any alias the module holds: the lab leaves the clock open) replaced
    by a clock that moves only inside the model's calls: ``per_token_s`` per token fed,
    and in the second call of every generation (when its mode shows)
    ``run_extra_s[(2 k + cached) % len]`` for the mode's k-th generation (the modes take
    turns along the list). ``process_time`` moves by the tokens fed alone, as CPU time
    misses what a run waits for: the lab asks for latency, so its figures are told apart.
    A generation starts with a call of exactly ``prompt_len`` tokens. The parent knows
    from this rule what every figure must be; the real clocks are back afterwards.
    ``args`` are the keyword arguments passed (none: the defaults)."""
    from values import encode_value

    rule = request["clock"]
    prompt_len, per_token = int(rule["prompt_len"]), float(rule["per_token_s"])
    extras = [float(x) for x in rule["run_extra_s"]]
    state: dict[str, Any] = {"now": 1000.0, "cpu": 1.0, "call": None, "runs": {True: 0, False: 0}}
    original = model.forward

    def ticking(*args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("input_ids")
        length = int(given.shape[-1]) if getattr(given, "ndim", 0) else -1
        if length == prompt_len:
            state["call"] = 0
        elif state["call"] is not None:
            state["call"] += 1
        work = per_token * (int(given.numel()) if hasattr(given, "numel") else 0)
        state["now"] += work
        state["cpu"] += work  # CPU time: the work alone, never the extras below
        if state["call"] == 1:
            cached = length == 1
            k = state["runs"][cached]
            state["runs"][cached] = k + 1
            state["now"] += extras[(2 * k + cached) % len(extras)]
        return original(*args, **kwargs)

    saved, fakes = _clock_places(mod, state)
    model.forward = ticking
    try:
        for obj, name, value in saved:
            setattr(obj, name, fakes[id(value)])
        result = mod.measure_latency(
            model, tuple(request["L_values"]), **request["args"], device=on or device()
        )
        sync()
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        del model.forward
    return {"result": encode_value(result)}
