"""Check 4.8's timed cases: ``measure_latency``'s figures against the grader's own
measurement of the very generations it ran (kept apart from
:mod:`grader.parts.part4.latency`, the judgement against the parent's clock around the
call).

Why this design. The course defines each figure as the milliseconds per generated
token of a generation of L tokens, with or without the cache, averaged over the timed
runs. That is a property of the runs, not of a clock: any clock that tells wall time
(``time.perf_counter`` taken as a default argument or at import, ``perf_counter_ns``,
``monotonic``, ``time.time``, ``datetime.now()``, ``timeit``'s timer, CUDA events)
gives the same figure to within its resolution. So no clock of the lab's is replaced:
the adapter records, on a clock of its own, when every model call and every generate
call began and ended, and makes each generation wait a known time inside it (its
place among the runs sets how long), so that runs differ by milliseconds and a figure
of the wrong runs is another number. Whatever clock the lab reads around a generation,
the time it reads lies between two measured bounds: at least the generation itself
(its generate call, or its model calls from the first one's start to the last one's
end), at most the time from the end of the call before it to the start of the call
after it. The median or the mean of the timed runs lies between the median or the mean
of their bounds, since both only grow with each run. The tolerance is the measurement
itself: a busy machine widens the bounds, it never puts a right figure outside them.

Beside each reading of its wall clock the adapter reads the process's and the thread's
CPU time, so every generation has the same two bounds on those clocks too: what a lab
reading ``time.process_time`` or ``time.thread_time`` around it would get. They only
name a clock (the grader's waits are sleeps, wall time and almost no CPU time, so the
two kinds of bounds lie apart); a figure is right only on wall time.

What each probe assumes is in docs/parts.md, beside check 4.8.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grader.parts.part4.latency import LATENCY_KEYS, rounded

HANDOUT_DEFAULTS = {"prompt_len": 8, "warmup": 1, "repeats": 3}  # the handout's signature
# The waits, the odd ms from 5 to 47 in a shuffled order: two runs of one L and mode
# always differ by 2 ms at least, far more than the bounds are apart on a quiet machine.
WAITS_S = tuple(ms / 1000 for ms in (
    15, 33, 11, 43, 31, 19, 5, 27, 45, 23, 41, 7, 17, 37, 29, 9, 47, 35, 13, 25, 39, 21,
))  # fmt: skip
CLOCK_SLACK_S = 20e-6  # per run: two readings of a clock of 1 us resolution, and float sums
#: The clocks a generation has bounds on: wall time, the process's CPU time (every
#: thread's: ``time.process_time``), the calling thread's (``time.thread_time``).
CLOCKS = ("wall", "process", "thread")
FIGURE_SLACK_MS = 0.005  # per figure: a figure rounded to 0.01 ms is still right
CPU_SHARE = 0.2  # naming only: CPU time holds at least this share of the model calls' time
#: What "ms per token" may average the timed runs with: the kit's handout says the
#: median, the course lab "average latency" (the mean); both are accepted.
AVERAGES: tuple[Callable[[list[float]], float], ...] = (statistics.median, statistics.mean)
MODE_OF_KEY = {"no_cache_ms_per_token": "no_cache", "cache_ms_per_token": "cache"}
FUNCTION_OF_MODE = {"no_cache": "generate_no_cache", "cache": "generate_with_cache"}


@dataclass(frozen=True)
class ClockedCase:
    """One ``measure_latency`` call timed by the grader: ``args`` are the keyword
    arguments passed (none: the handout's defaults); every L is at least 2, so that a
    generation found by its model calls shows its mode in its second call."""

    L_values: tuple[int, ...]
    args: dict[str, int] = field(default_factory=dict)
    waits_s: tuple[float, ...] = WAITS_S

    @property
    def settings(self) -> dict[str, int]:
        return {**HANDOUT_DEFAULTS, **self.args}

    @property
    def what(self) -> str:
        if not self.args:
            return f"measure_latency(model, {self.L_values}) with the handout's defaults"
        given = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"measure_latency(model, {self.L_values}, {given})"

    def request(self) -> dict[str, Any]:
        """The worker's request (the device is the grading one, passed by the adapter)."""
        return {"op": "latency_timed", "model": "lab", "L_values": list(self.L_values),
                "args": dict(self.args), "prompt_len": self.settings["prompt_len"],
                "waits_s": list(self.waits_s)}  # fmt: skip


CLOCKED_CASES = (
    # repeats = 5: a loop of the handout's 1 + 3 runs written in is short of runs
    ClockedCase((2, 5), {"prompt_len": 6, "warmup": 2, "repeats": 5}),
    ClockedCase((3, 4)),  # the handout's defaults
)


@dataclass(frozen=True)
class Generation:
    """One generation ``measure_latency`` ran, as the grader measured it: any clock's
    time around it lies in [``low_s``, ``high_s``]; ``waited_s`` is the grader's wait in
    it; ``first``: no model call came before it (nothing warmed the model up)."""

    mode: str
    L: int
    rows: int
    tokens: int  # the prompt's length (-1 where it was not seen)
    low_s: float
    high_s: float
    waited_s: float
    first: bool
    #: On the adapter's wall clock since its record began: the earliest time a clock read
    #: before the generation can have been read, when it began and ended, and the latest
    #: time a clock read after it can have been read (a span across runs is bounded by
    #: them); None where not known.
    span: tuple[float, float, float, float] | None = None
    cpu: tuple[float, float] | None = None  # its bounds on the process's CPU time
    thread: tuple[float, float] | None = None  # ... on the thread's (one thread ran all)

    def bounds(self, clock: str) -> tuple[float, float] | None:
        """[low, high] on ``clock`` (one of :data:`CLOCKS`), or None where not recorded."""
        if clock == "wall":
            return self.low_s, self.high_s
        return self.cpu if clock == "process" else self.thread


def _rows(value: Any, width: int) -> list[list[Any]] | None:
    """``value`` as rows of ``width`` items whose times are finite numbers, or None."""
    if not isinstance(value, list) or not all(
        isinstance(r, list) and len(r) == width for r in value
    ):
        return None
    return value


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _found_by_calls(calls: list[list[Any]], prompt_len: int) -> list[tuple]:
    """Generations found by their model calls, the handout's: ``prompt_len`` tokens,
    then one token per call with the cache, one more every call without it. Each ends
    with the indices of its first and last call."""
    runs: list[list[int]] = []
    for i, call in enumerate(calls):
        if call[5] != -1:
            continue
        if call[2] == prompt_len:
            runs.append([i])
        elif runs:
            runs[-1].append(i)
    found = []
    for run in runs:
        lengths, L = [calls[i][2] for i in run], len(run)
        cached = L > 1 and lengths[1] == 1
        want = [prompt_len] + [1] * (L - 1) if cached else list(range(prompt_len, prompt_len + L))
        if L > 1 and lengths == want:
            first, last = calls[run[0]], calls[run[-1]]
            t0, t1, waited = first[0], last[1], sum(calls[i][4] for i in run)
            found.append(("cache" if cached else "no_cache", L, t0, t1, first[3],
                          prompt_len, t1 - t0, waited, run[0], run[-1]))  # fmt: skip
    return found


def _cpu_record(reply: dict[str, Any], calls: list, made: list) -> tuple[list, list, list] | None:
    """The CPU times beside ``calls`` and ``made`` (rows of [process at start, at end,
    thread at start, at end]) and at the end, or None where the reply holds none that
    can be read (an adapter that records no CPU time)."""
    on_calls, on_made = _rows(reply.get("calls_cpu"), 4), _rows(reply.get("generations_cpu"), 4)
    ended = reply.get("ended_cpu")
    if on_calls is None or on_made is None or _rows([ended], 2) is None:
        return None
    if len(on_calls) != len(calls) or len(on_made) != len(made):
        return None
    if not all(_number(x) for row in (*on_calls, *on_made, ended) for x in row):
        return None
    return on_calls, on_made, ended


def generations_of(reply: dict[str, Any], prompt_len: int) -> tuple[list[Generation], str]:
    """The generations of a ``latency_timed`` reply with their bounds, or "" and why the
    reply cannot be read: the generate calls the lab made through the module's names, and
    the generations its model calls outside them show (the handout's pattern of calls)."""
    calls, made, ended = _rows(reply.get("calls"), 6), _rows(reply.get("generations"), 7), None
    if calls is not None and made is not None and _number(reply.get("ended")):
        ended = float(reply["ended"])
        times = [x for row in calls for x in (row[0], row[1], row[4])]
        times += [x for row in made for x in (row[2], row[3], row[6])]
        if not all(_number(x) for x in times):
            ended = None
    if ended is None:
        return [], "The worker's record of measure_latency's calls could not be read."
    cpu = _cpu_record(reply, calls, made)
    # Every event's CPU times (process and thread) at its start and its end: none known
    # where not recorded; the thread's only where one thread made every event.
    one_thread = reply.get("threads") == 1
    on_calls, on_made, cpu_ended = cpu if cpu else ([], [], [])
    cpu_of = [(r[0], r[2], r[1], r[3]) for r in (*on_calls, *on_made)]
    # Both sources at once: a lab may time one mode through the module's generate
    # functions and the other through calls of its own (generate_with_cache_from, a loop).
    spans = [(m, L, t0, t1, rows, tokens, t1 - t0, waited, len(calls) + i, len(calls) + i)
             for i, (m, L, t0, t1, rows, tokens, waited) in enumerate(made)]  # fmt: skip
    spans = sorted(spans + _found_by_calls(calls, prompt_len), key=lambda span: span[2])
    events = [(row[0], row[1]) for row in calls] + [(row[2], row[3]) for row in made]
    ends = sorted((e, i) for i, (_, e) in enumerate(events))
    starts = sorted((s, i) for i, (s, _) in enumerate(events))
    end_times, start_times = [e for e, _ in ends], [s for s, _ in starts]
    first_call = min((row[0] for row in calls), default=math.inf)
    out = []
    for mode, L, t0, t1, rows, tokens, low, waited, i0, i1 in spans:
        before = bisect.bisect_right(end_times, t0)  # events over by the time it began
        after = bisect.bisect_left(start_times, t1)  # the first event begun once it was over
        prev = ends[before - 1][1] if before else None
        nxt = starts[after][1] if after < len(starts) else None
        earliest = ends[before - 1][0] if before else 0.0
        latest = starts[after][0] if after < len(starts) else ended
        on = {}
        for clock, k in (("process", 0), ("thread", 1)) if cpu else ():
            lo = cpu_of[i1][2 + k] - cpu_of[i0][k]
            hi = (cpu_of[nxt][k] if nxt is not None else cpu_ended[k]) - (
                cpu_of[prev][2 + k] if prev is not None else 0.0
            )
            on[clock] = (lo, hi) if 0 <= lo <= hi else None  # None: not one thread's
        out.append(Generation(str(mode), L if isinstance(L, int) else -1, rows, tokens,
                              low, latest - earliest, waited, first_call >= t0,
                              (earliest, t0, t1, latest), on.get("process"),
                              on.get("thread") if one_thread else None))  # fmt: skip
    return out, ""


# ------------------------------------------------------------------ the judgement

#: A reading of the figures: whether figure ``x`` fits a group's generations (those of
#: one L and mode, in the order they ran) at that L.
Reading = Callable[[float, list[Generation], int], bool]


def reading(
    repeats: int,
    unit: Callable[[int], float] = lambda L: 1000 / L,
    first_only: bool = False,
    cpu: bool = False,
    whole_ms: bool = False,
) -> Reading:
    """The figures as the average of the last ``repeats`` runs of each group, times
    ``unit(L)`` (ms per token: 1000 / L); or of the first of them only; or on a CPU-time
    clock (``cpu``: the process's or the thread's, on the bounds the adapter recorded;
    where it recorded none, loosely: the grader's waits left out, as CPU time misses
    what a run waits for); or rounded down to whole ms."""

    def fits(x: float, group: list[Generation], L: int) -> bool:
        if len(group) < repeats:
            return False
        runs = group[-repeats:][:1] if first_only else group[-repeats:]
        slack = FIGURE_SLACK_MS * unit(L) * L / 1000  # the rounding, in the reading's unit
        recorded = [c for c in CLOCKS[1:] if all(g.bounds(c) for g in runs)] if cpu else []
        bounds = [[g.bounds(c) for g in runs] for c in recorded or ["wall"]]
        if cpu and not recorded:  # the model's work without the waits, a fifth of it at least
            bounds = [[(CPU_SHARE * (g.low_s - g.waited_s), g.high_s - g.waited_s) for g in runs]]
        averages = (statistics.median,) if first_only else AVERAGES
        for average, on in itertools.product(averages, bounds):
            low = average([lo - CLOCK_SLACK_S for lo, _ in on])
            high = average([hi + CLOCK_SLACK_S for _, hi in on])
            lo, hi = low * unit(L) - slack, high * unit(L) + slack
            if whole_ms:
                lo, hi = math.floor(lo), math.floor(hi)
            if lo <= x <= hi and (not whole_ms or x == math.floor(x)):
                return True
        return False

    return fits


def groups_of(gens: list[Generation], key: str, L: int) -> list[Generation]:
    """The generations of ``key``'s mode with ``L`` new tokens, in the order they ran."""
    return [g for g in gens if g.mode == MODE_OF_KEY[key] and g.L == L]


def fits_all(got: dict[str, list[float]], gens: list[Generation], L_values, read: Reading) -> bool:
    return all(
        read(x, groups_of(gens, key, L), L)
        for key in LATENCY_KEYS
        for x, L in zip(got[key], L_values, strict=True)
    )


def known_readings(repeats: int) -> list[tuple[str, str | None, Reading]]:
    """Wrong readings a feedback can name: (what, the catalogued mistake or None, how)."""
    runs = [(f"the average of the last {r} runs of each L and mode, not of repeats = "
             f"{repeats}", None, reading(r)) for r in range(1, 8) if r != repeats]  # fmt: skip
    return [
        *runs,
        ("keeping only the first timed run instead of the median of `repeats` of them", None,
         reading(repeats, first_only=True)),
        ("timing with the process's CPU time (time.process_time, thread_time): the lab asks "
         "for latency, the wall-clock time a generation takes (time.perf_counter), which a "
         "GPU's work or a wait adds to", None, reading(repeats, cpu=True)),
        ("ms per token rounded down to whole milliseconds", None,
         reading(repeats, whole_ms=True)),
        ("the time of whole generations, not divided by L", "latency_totals",
         reading(repeats, unit=lambda L: 1000.0)),
        ("seconds per token, not milliseconds", None, reading(repeats, unit=lambda L: 1 / L)),
    ]  # fmt: skip


def shape_problem(timed: list[Generation], prompt_len: int) -> str:
    """Why the timed runs' prompt is not the handout's single row of ``prompt_len``."""
    rows = sorted({g.rows for g in timed if g.rows not in (1, -1)})
    tokens = sorted({g.tokens for g in timed if g.tokens not in (prompt_len, -1)})
    if rows:
        return (f"its timed runs generated from a prompt of {rows[0]} rows; the prompt is a "
                f"single row of prompt_len tokens, shape (1, {prompt_len}).")  # fmt: skip
    if tokens:
        return (f"its timed runs generated from a prompt of {tokens[0]} tokens, where "
                f"prompt_len = {prompt_len}: the prompt is (1, prompt_len).")  # fmt: skip
    return ""


def first_wrong_figure(
    got: dict[str, list[float]], gens: list[Generation], L_values: tuple[int, ...], repeats: int
) -> str:
    """Which figure is wrong first, with the bounds the grader's clock gives for it."""
    right = reading(repeats)
    for key in LATENCY_KEYS:
        for L, x in zip(L_values, got[key], strict=True):
            group = groups_of(gens, key, L)
            fn = FUNCTION_OF_MODE[MODE_OF_KEY[key]]
            if len(group) < repeats:
                return (f"{key} at L = {L}: {fn} ran {len(group)} times for that L, fewer "
                        f"than the repeats = {repeats} timed runs.")  # fmt: skip
            if not right(x, group, L):
                runs = group[-repeats:]
                lo = statistics.median(g.low_s for g in runs) * 1000 / L
                hi = statistics.median(g.high_s for g in runs) * 1000 / L
                return (f"{key} at L = {L} is {x:.4g}, where the grader's clock puts the median "
                        f"of its last {repeats} runs between {lo:.4g} and {hi:.4g}.")  # fmt: skip
    return "every figure is off."


def timed_problem(
    case: ClockedCase,
    got: dict[str, list[float]],
    gens: list[Generation],
    defaults_only: bool = False,
    say_match: bool = True,
) -> tuple[str, str | None]:
    """ "" if ``got`` are the figures of the generations the grader measured: for each L
    and mode, the median (or the mean) of the last ``repeats`` runs over L, in ms (any
    number of untimed runs of the lab's own before them), the first generation untimed
    (see :class:`Generation`); else what is wrong, and the catalogued mistake it
    matches (or None). ``defaults_only``: the case passing every argument was right, so
    the defaults are suspect. ``say_match``: say which wrong reading the figures match
    (left out where the isolation of :mod:`grader.parts.part4.latency_isolate` decided).
    """
    s = case.settings
    repeats, L_values = s["repeats"], case.L_values
    timed = [
        g for key in LATENCY_KEYS for L in L_values for g in groups_of(gens, key, L)[-repeats:]
    ]
    problem, name = shape_problem(timed, s["prompt_len"]), None
    if not problem and fits_all(got, gens, L_values, reading(repeats)):
        if not any(g.first for g in timed):
            return "", None
        problem, name = (
            "its timed runs include the first generation it ran, with nothing before it: "
            "that run holds the model's one-off start-up costs. Run an untimed warm-up "
            "first (the warmup runs of every L, or a warm-up of your own).",
            "latency_no_warmup",
        )
    if not problem:
        problem = (
            "the grader timed every generation it ran on a clock of its own, each made to "
            "wait a known time by its place among the runs; whatever clock measure_latency "
            "reads, each figure must then lie between the bounds of the median (or the mean) "
            f"of the last repeats = {repeats} runs of its L and mode, over L, in ms, and they "
            f"do not: {first_wrong_figure(got, gens, L_values, repeats)}"
        )
        matches = {(text, known) for text, known, read in known_readings(repeats)
                   if fits_all(got, gens, L_values, read)}  # fmt: skip
        if len(matches) == 1 and say_match:
            [(text, name)] = matches
            problem += f" They match {text}."
    problem = f"{case.what} returned {rounded(got)}: {problem}"
    if defaults_only:
        problem += (
            " With every argument passed the figures were right: the defaults must be the "
            "handout's (prompt_len=8, warmup=1, repeats=3)."
        )
    return problem, name
