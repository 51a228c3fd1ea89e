"""Part 4's latency judgements, in trusted code: the figures ``measure_latency``
returned (check 4.8) against the grader's clock around the call (its timed cases,
against the grader's measurement of every generation it ran, are in
:mod:`grader.parts.part4.latency_clock`); and check 4.6's verdicts on the timed
generations.

No figure measured in the worker is trusted as a time: the parent's clock bounds
what the figures may stand for. Every pass condition is written so that NaN fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grader.judging.base import shown
from grader.runtime.timing import Criterion, Ratio, Timing

LATENCY_KEYS = ("no_cache_ms_per_token", "cache_ms_per_token")
MAX_SHARE = 1.1  # timed runs (from the figures) may fill at most this share of the work time
MIN_SHARE = 0.02  # ... and at least this share of it (ms, not seconds): stalls may fill the rest


def latency_figures(result: Any, L_values: list[int]) -> tuple[dict[str, list[float]], str]:
    """The figures of a decoded ``measure_latency`` result, or "" and a problem."""
    if not isinstance(result, dict):
        return {}, "measure_latency must return a dict."
    got: dict[str, list[float]] = {}
    if result.get("L") != L_values:
        return (
            {},
            f"measure_latency returned L = {shown(result.get('L'))} for L_values = {L_values}.",
        )
    for key in LATENCY_KEYS:
        values = result.get(key)
        if not (
            isinstance(values, list)
            and len(values) == len(L_values)
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in values)
            and all(math.isfinite(x) and x > 0 for x in values)
        ):
            return {}, (
                f"measure_latency's {key!r} must be {len(L_values)} finite positive "
                f"numbers, got {shown(values)}."
            )
        got[key] = [float(x) for x in values]
    return got, ""


@dataclass(frozen=True)
class LatencyVerdict:
    """The timed runs the figures stand for, against the grader's clock."""

    timed_s: float  # sum over L and modes of ms/token x L x repeats, in seconds
    work_s: float  # the call's wall time less the grader's one-off delay
    delay_s: float
    longest_run_s: float  # the slowest single run the figures stand for

    @property
    def share(self) -> float:
        return self.timed_s / self.work_s if self.work_s > 0 else math.inf

    @property
    def passed(self) -> bool:
        return MIN_SHARE <= self.share <= MAX_SHARE

    def summary(self, what: str, figures: dict[str, list[float]]) -> str:
        return (
            f"{what} returned {rounded(figures)}; the timed runs they stand for add up to "
            f"{self.timed_s:.3f} s; the call spent {self.work_s:.3f} s generating."
        )

    def explain(self, what: str, figures: dict[str, list[float]]) -> str:
        """Why the figures do not fit the grader's clock, and what they should be."""
        return (
            f"{what} returned {rounded(figures)}. As ms per token x L for every timed run they "
            f"stand for {self.timed_s:.3f} s of timed generation, but by the grader's clock "
            f"the call spent {self.work_s:.3f} s generating (its whole time less a one-off delay "
            f"of {self.delay_s:.2f} s that the grader put in the very first model call, which "
            "a warm-up run absorbs). The timed runs must fit in that time and fill a fair part "
            "of it: report the median of the timed runs, after the warm-up runs, divided by L, "
            "in milliseconds."
        )

    def mistake(self, totals_share: float) -> str | None:
        """``"latency_no_warmup"`` when one run holds at least half the delay and the others
        fit in the work time; ``"latency_totals"`` when the figures fit as whole-run times;
        None otherwise."""
        if self.passed:
            return None
        rest = self.timed_s - self.longest_run_s
        if self.longest_run_s >= self.delay_s / 2 and rest <= MAX_SHARE * self.work_s:
            return "latency_no_warmup"
        if MIN_SHARE <= totals_share <= MAX_SHARE:
            return "latency_totals"
        return None


def rounded(figures: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [float(f"{x:.4g}") for x in v] for k, v in figures.items()}


def judge_latency(
    figures: dict[str, list[float]],
    L_values: list[int],
    repeats: int,
    wall_s: float,
    delay_s: float,
) -> tuple[LatencyVerdict, float]:
    """The verdict, and the share the figures would fill were they whole-run times."""
    runs = [
        ms * L / 1000 for key in LATENCY_KEYS for ms, L in zip(figures[key], L_values, strict=True)
    ]
    totals = [ms / 1000 for key in LATENCY_KEYS for ms in figures[key]]
    work = wall_s - delay_s
    verdict = LatencyVerdict(sum(runs) * repeats, work, delay_s, max(runs))
    totals_share = sum(totals) * repeats / work if work > 0 else math.inf
    return verdict, totals_share


# ------------------------------------------------------------------------- 4.6


def latency_criteria(
    timings: dict[str, Timing], bench: dict[str, Any], clock: str
) -> list[Criterion]:
    """4.6's verdicts on per-token timings of the variants ``"with/without the cache, L =
    N"``: cached nearly flat, cache-free growing, and the cache faster at the longest L
    (a cache that does not cache can look flat enough on a tiny model; it is never faster)."""
    lo, hi = bench["L_values"]
    on = "CPU time" if clock == "cpu" else "time"

    def mode(cached: bool, L: int) -> list[float]:
        return timings[f"{'with' if cached else 'without'} the cache, L = {L}"].on(clock)

    return [
        Criterion(
            "part4.max_cached_growth",
            f"cached {on} per token, L = {hi} over L = {lo}",
            Ratio.between(mode(True, hi), mode(True, lo)),
            bench["max_cached_growth"],
            False,
        ),
        Criterion(
            "part4.min_no_cache_growth",
            f"cache-free {on} per token, L = {hi} over L = {lo}",
            Ratio.between(mode(False, hi), mode(False, lo)),
            bench["min_no_cache_growth"],
            True,
        ),
        Criterion(
            "part4.min_speedup",
            f"cache-free over cached {on} per token, L = {hi}",
            Ratio.between(mode(False, hi), mode(True, hi)),
            bench["min_speedup"],
            True,
        ),
    ]
