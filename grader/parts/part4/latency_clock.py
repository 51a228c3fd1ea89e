"""Check 4.8's exact cases: ``measure_latency`` on a clock the adapter drives from the
model calls, where every right figure is known in advance (kept apart from
:mod:`grader.parts.part4.latency`, the judgements against the grader's own clock).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from grader.parts.part4.latency import LATENCY_KEYS, rounded

# The adapter replaces time.perf_counter, during one measure_latency call, by a clock that
# only moves inside the model's calls: CLOCK_PER_TOKEN_S per token fed (batch x length),
# and, in the second call of every generation (when its mode shows: one token fed with
# the cache, the whole sequence without), ``extras_s[(2 k + cached) % len(extras_s)]``
# for the mode's k-th generation (the modes take turns along the list). A generation
# starts with a call of exactly prompt_len tokens. So every run gets the extra of its
# place, and every figure is known here in advance: a timed warm-up, another number of
# runs, another prompt, a single timed run or a rounded figure all give other numbers.
# time.process_time is driven by the tokens alone (CPU time misses the extras, as it
# misses a GPU's work and waits): the lab asks for latency, so its figures are named.
CLOCK_PER_TOKEN_S = 0.00037  # not a whole number of ms per token at any L
CLOCK_RTOL = 1e-6  # float sums of the driven clock's steps; a rounding is far larger
HANDOUT_DEFAULTS = {"prompt_len": 8, "warmup": 1, "repeats": 3}  # the handout's signature
# The extras, the odd ms from 11 to 73 in a shuffled order: with them every run count
# (warmup 0-3, repeats 1-5), a single timed run and a batch of 2 give figures of their
# own on both cases (tests/test_part4_latency.py checks it), so the feedback can tell
# which one a submission's figures are.
CLOCK_EXTRAS_S = tuple(ms / 1000 for ms in (
    15, 33, 61, 53, 31, 19, 69, 43, 57, 23, 47, 63, 17, 71, 27, 11,
    49, 35, 51, 37, 25, 21, 45, 39, 65, 55, 29, 67, 59, 13, 41, 73,
))  # fmt: skip


@dataclass(frozen=True)
class ClockedCase:
    """One measure_latency call on the driven clock: ``args`` are the keyword arguments
    passed (none: the handout's defaults); every L is at least 2, so that every
    generation has a second call."""

    L_values: tuple[int, ...]
    args: dict[str, int] = field(default_factory=dict)
    extras_s: tuple[float, ...] = CLOCK_EXTRAS_S

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
        return {
            "op": "latency_clock",
            "model": "lab",
            "L_values": list(self.L_values),
            "args": dict(self.args),
            "clock": {
                "prompt_len": self.settings["prompt_len"],
                "per_token_s": CLOCK_PER_TOKEN_S,
                "run_extra_s": list(self.extras_s),
            },
        }


CLOCKED_CASES = (
    ClockedCase((2, 5), {"prompt_len": 6, "warmup": 2, "repeats": 3}),
    ClockedCase((3, 4)),  # the handout's defaults
)


#: Untimed generations a measure_latency may run in each mode before its loop over L (one
#: warm-up pass of its own, outside the timed runs): extra untimed work is allowed, so the
#: figures of such a start are right too. No known mistake gives the figures of any of
#: these starts (tests/parts/part4/test_latency.py); two such passes of the cache-free
#: path would look like two warm-ups of every L.
UNTIMED_STARTS = tuple(itertools.product(range(2), repeat=2))  # (no cache, cache)
#: What "ms per token" may average the timed runs with: the kit's handout says the
#: median, the course's lab "average latency" (the mean); both are accepted.
AVERAGES = (statistics.median, statistics.mean)


def clocked_figures(
    case: ClockedCase,
    batch: int = 1,
    warmup: int | None = None,
    repeats: int | None = None,
    first_only: bool = False,
    start: tuple[int, int] = (0, 0),
    average: Callable[[list[float]], float] = statistics.median,
) -> dict[str, list[float]]:
    """The figures ``measure_latency`` returns for ``case`` on the driven clock: the
    median of the timed runs' clock time over L, in ms. ``start``: the untimed
    generations each mode ran before its loop (no cache, cache); ``average``: the
    median (the kit's handout) or the mean (the course lab's "average latency"). The other arguments
    describe a known mistake (a prompt of ``batch`` rows, other run counts, only the
    first timed run kept), for the feedback."""
    s = case.settings
    w = s["warmup"] if warmup is None else warmup
    r = s["repeats"] if repeats is None else repeats
    P, extras = s["prompt_len"], case.extras_s
    figures: dict[str, list[float]] = {}
    for key, first_k in zip(LATENCY_KEYS, start, strict=True):
        k = first_k  # this mode's generations so far, as the adapter counts them
        figures[key] = []
        for L in case.L_values:
            fed = P + L - 1 if key == "cache_ms_per_token" else sum(P + j for j in range(L))
            times = []
            for i in range(w + r):
                cached = key == "cache_ms_per_token"
                run = CLOCK_PER_TOKEN_S * batch * fed + extras[(2 * k + cached) % len(extras)]
                k += 1
                if i >= w:
                    times.append(run)
            kept = times[:1] if first_only else times
            figures[key].append(average(kept) * 1000 / L if kept else math.nan)
    return figures


def same_figures(got: dict[str, list[float]], want: dict[str, list[float]]) -> bool:
    """Equal within the driven clock's float error (NaN never is)."""
    return all(
        len(got.get(key, [])) == len(want[key])
        and all(abs(g - x) <= CLOCK_RTOL * abs(x) for g, x in zip(got[key], want[key], strict=True))
        for key in LATENCY_KEYS
    )


def accepted_figures(case: ClockedCase, own_warmup: bool = False) -> list[dict[str, list[float]]]:
    """Every right set of figures for ``case``: each untimed start and each average, with
    ``warmup`` untimed runs per L and mode; with ``own_warmup`` (the lab warmed up in a
    way of its own, as the course's lab leaves open: the grader's real clock saw the
    first model call's delay outside the timed runs) also with none, every one of the
    ``repeats`` runs timed."""
    warmups = (case.settings["warmup"], 0) if own_warmup else (case.settings["warmup"],)
    return [
        clocked_figures(case, warmup=w, start=start, average=average)
        for w in dict.fromkeys(warmups)
        for start in UNTIMED_STARTS
        for average in AVERAGES
    ]


def clocked_problem(
    case: ClockedCase,
    got: dict[str, list[float]],
    defaults_only: bool = False,
    own_warmup: bool = False,
) -> tuple[str, str | None]:
    """ "" if ``got`` are figures the driven clock gives for ``case`` (see
    :func:`accepted_figures`); else what is wrong, and the catalogued mistake they
    match (or None). ``defaults_only``: the case that passes every argument was right,
    so the defaults are suspect."""
    right = accepted_figures(case, own_warmup)
    if any(same_figures(got, figures) for figures in right):
        return "", None
    want = clocked_figures(case)
    s = case.settings
    runs = {(s["warmup"], s["repeats"])} | ({(0, s["repeats"])} if own_warmup else set())
    known: list[tuple[str, str | None, dict[str, list[float]]]] = [
        (f"{w} warm-up and {r} timed runs per L and mode", None if w else "latency_no_warmup",
         clocked_figures(case, warmup=w, repeats=r))
        for w in range(4)
        for r in range(1, 6)
        if (w, r) not in runs
    ]  # fmt: skip
    known += [
        ("timing with time.process_time, the process's CPU time: the lab asks for latency, "
         "the wall-clock time a generation takes (time.perf_counter), which a GPU's work or "
         "a wait adds to", None, clocked_figures(replace(case, extras_s=(0.0,)))),
        ("keeping only the first timed run instead of the median of `repeats` of them", None,
         clocked_figures(case, first_only=True)),
        ("a prompt of 2 rows (the prompt is a single row of prompt_len tokens)", None,
         clocked_figures(case, batch=2)),
        ("ms per token rounded down to whole milliseconds", None,
         {k: [float(math.floor(x)) for x in v] for k, v in want.items()}),
        ("the time of whole generations, not divided by L", "latency_totals",
         {k: [x * L for x, L in zip(v, case.L_values, strict=True)] for k, v in want.items()}),
    ]  # fmt: skip
    problem = (
        f"{case.what} returned {rounded(got)}. The grader ran it on a clock of its own: "
        "every standard clock (time.perf_counter, time.monotonic, time.time, ...) moved "
        "only inside the model's calls, by a fixed time per token fed, plus in every "
        "generation an amount set by its place among the warmup + repeats runs of its L. "
        "On that clock each figure must be exactly the median (or the mean) of the timed runs "
        "divided by "
        f"L, in ms, and they are not: {first_wrong_figure(got, want, case.L_values)}"
    )
    matches = {(text, name) for text, name, figures in known if same_figures(got, figures)}
    name = None
    if len(matches) == 1:
        [(text, name)] = matches
        problem += f" They match {text}."
    if defaults_only:
        problem += (
            " With every argument passed the figures were right: the defaults must be the "
            "handout's (prompt_len=8, warmup=1, repeats=3)."
        )
    return problem, name


def first_wrong_figure(
    got: dict[str, list[float]], want: dict[str, list[float]], L_values: tuple[int, ...]
) -> str:
    """Which figure is wrong first, with the value the driven clock gives for it."""
    for key in LATENCY_KEYS:
        values = got.get(key, [])
        if len(values) != len(want[key]):
            return f"{key} holds {len(values)} figures for {len(want[key])} values of L."
        for L, g, x in zip(L_values, values, want[key], strict=True):
            if not abs(g - x) <= CLOCK_RTOL * abs(x):
                return f"{key} at L = {L} is {g:.4g}, where that clock gives {x:.4g}."
    return "every figure is off."
