"""The one timing harness behind every graded benchmark (checks 2.11, 3.11, 4.6).

A benchmark check times worker requests whose outputs it also checks. The
clock is the parent's (``WorkerClient.request`` reads it around the request;
the worker synchronises CUDA before it answers every request, so queued GPU
work is inside the interval), and so is the CPU time the kernel charged to the
worker during the request (:mod:`grader.runtime.usage`: every thread of the worker,
its reaped children and its live descendants). A submission cannot forge that
figure downward, and a busy machine barely moves it: time spent waiting for a
core is not CPU time. On CPU the verdicts are on CPU time; wall time is shown
beside it. Peak memory is the worker's peak RSS growth, sampled by the parent,
on CPU; on CUDA the worker's own ``torch.cuda.max_memory_allocated`` (the course's
figure, which a submission can forge) beside the GPU memory its processes held, sampled
by the parent through NVML (:mod:`grader.runtime.gpu_memory`), which it cannot. Peak
memory is shown and never judged.

Every verdict is a ratio of two variants measured in the same run (cached
against cache-free, long against short), never an absolute time: a slower or
busier machine moves both sides together. Variants are interleaved run by run
so that a burst of background load hits both.

On a shared machine noise only ever adds time, and it comes in bursts: a stall
of a few hundred milliseconds can swallow several 10 ms runs in a row. So a
measurement that misses a threshold is confirmed once (``measure``): more
rounds are timed and the verdict is on the median of all of them. A correct
submission outvotes a burst; a cache that does not cache stays near 1x however
many rounds are timed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: What a benchmark's ratios are taken of: "cpu" (CPU seconds) or "wall" (wall seconds).
CLOCKS = ("cpu", "wall")
#: With this variable set to 1, a benchmark times every round even once its timed runs
#: have lost the check some other way (calibration needs the cache-free designs' ratios).
FULL_TIMING = "KVGRADER_FULL_TIMING"


def clock_for(device: str) -> str:
    """The clock verdicts use on ``device``: CPU time on a CPU (what the worker did,
    whatever else the machine runs); wall time on a GPU, where the work is not the
    worker's CPU time."""
    return "cpu" if device == "cpu" else "wall"


@dataclass(frozen=True)
class Sample:
    """One timed run: wall seconds, the worker's CPU seconds and, where measured, peak
    bytes. ``cpu_seconds`` is None where it could not be read; ratios then fall back to
    wall seconds."""

    seconds: float
    peak_bytes: int | None = None
    cpu_seconds: float | None = None
    peak_source: str | None = None  # "rss" (read by the grader) or "worker" (its own report)
    gpu_held_bytes: int | None = None  # GPU memory the worker held, read by the grader (NVML)

    def on(self, clock: str) -> float:
        """This run's seconds on ``clock``."""
        if clock == "cpu" and self.cpu_seconds is not None:
            return self.cpu_seconds
        return self.seconds


@dataclass(frozen=True)
class Timing:
    """The timed runs of one variant (warm-up runs already left out)."""

    samples: tuple[Sample, ...]

    @property
    def seconds(self) -> list[float]:
        return [s.seconds for s in self.samples]

    @property
    def cpu_seconds(self) -> list[float]:
        return [s.on("cpu") for s in self.samples]

    def on(self, clock: str) -> list[float]:
        """Every run's seconds on ``clock`` ("cpu" or "wall")."""
        return self.cpu_seconds if clock == "cpu" else self.seconds

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: 0.1 means the runs lie within 10 % of the median."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median else 0.0

    @property
    def peak_bytes(self) -> int | None:
        peaks = [s.peak_bytes for s in self.samples if s.peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def gpu_held_bytes(self) -> int | None:
        held = [s.gpu_held_bytes for s in self.samples if s.gpu_held_bytes is not None]
        return max(held) if held else None

    @property
    def peak_source(self) -> str | None:
        """Where the runs' peaks were read; "worker" if any run's came from the worker
        itself (its figure is the submission's to forge)."""
        sources = {s.peak_source for s in self.samples if s.peak_bytes is not None}
        return "worker" if "worker" in sources else next(iter(sorted(sources)), None)

    def summary(self) -> dict[str, Any]:
        return {
            "median_s": self.median,
            "spread": self.spread,
            "runs_s": self.seconds,
            "cpu_median_s": self.cpu_median,
            "cpu_runs_s": self.cpu_seconds,
            "peak_bytes": self.peak_bytes,
            "peak_source": self.peak_source,
            "gpu_held_bytes": self.gpu_held_bytes,
        }


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` of two interleaved timings: the ratio of their medians,
    and the lowest and highest ratio of the runs paired by repeat (the spread)."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, numerator: Timing, denominator: Timing, clock: str = "wall") -> Ratio:
        """The ratio of two timings' seconds on ``clock`` ("wall" or "cpu")."""
        return cls.between(numerator.on(clock), denominator.on(clock))

    @classmethod
    def between(cls, numerators: Sequence[float], denominators: Sequence[float]) -> Ratio:
        """The ratio of two equally long series, paired by repeat."""
        pairs = [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]
        top, bottom = statistics.median(numerators), statistics.median(denominators)
        middle = top / bottom if bottom > 0 else float("inf")
        return cls(middle, min(pairs, default=middle), max(pairs, default=middle))

    @classmethod
    def against(cls, numerator: Timing, yardstick: Timing, clock: str = "wall") -> Ratio:
        """``numerator`` over a timing of another process's runs (the reference's, timed in
        the same grading but not paired by repeat): the ratio of their medians, its spread
        each of the numerator's runs over the yardstick's median. NaN (every comparison
        false) when the yardstick has no positive median."""
        runs, bottom = numerator.on(clock), statistics.median(yardstick.on(clock))
        if not bottom > 0:
            return cls(math.nan, math.nan, math.nan)
        ratios = [r / bottom for r in runs]
        return cls(statistics.median(runs) / bottom, min(ratios), max(ratios))

    def __str__(self) -> str:
        return f"{self.median:.2f}x (runs {self.low:.2f}-{self.high:.2f}x)"


@dataclass(frozen=True)
class Criterion:
    """One threshold of a benchmark check, applied to the median of a ratio.

    ``key`` is where the threshold lives in a profile of ``thresholds.toml``
    (``part3.min_speedup.8``), so calibration can propose a new value for it.
    """

    key: str
    label: str
    ratio: Ratio
    limit: float
    at_least: bool  # True: the ratio must reach the limit; False: stay within it

    @property
    def passed(self) -> bool:
        if self.at_least:
            return self.ratio.median >= self.limit
        return self.ratio.median <= self.limit

    def describe(self) -> str:
        need = "at least" if self.at_least else "at most"
        mark = "ok" if self.passed else "NOT MET"
        return f"{self.label}: {self.ratio}, needed {need} {self.limit:g}x [{mark}]"

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


@dataclass
class BenchmarkRecord:
    """What one benchmark check measured, kept in the results' ``extra_data``."""

    check: str
    profile: str
    criteria: list[Criterion] = field(default_factory=list)
    timings: dict[str, Timing] = field(default_factory=dict)
    leaderboard: dict[str, float] = field(default_factory=dict)  # tokens_per_s, speedup
    extra_rounds: int = 0  # rounds added to each measurement that missed (0: none needed)
    cut_short: bool = False  # a measurement stopped once something else decided the check

    def add(self, measurement: Measurement) -> None:
        """Keep the timings and the verdicts of one measurement."""
        self.timings.update(measurement.timings)
        self.criteria.extend(measurement.criteria)
        self.extra_rounds = max(self.extra_rounds, measurement.extra_rounds)
        self.cut_short = self.cut_short or measurement.cut_short

    def add_reference(self, reference: dict[str, Timing]) -> None:
        """Keep the reference's timings of this grading (the yardstick), beside the
        submission's, as "the reference, <variant>"."""
        self.timings.update({f"the reference, {v}": t for v, t in reference.items()})

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.criteria)

    def failures(self) -> list[Criterion]:
        return [c for c in self.criteria if not c.passed]

    def summary(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "profile": self.profile,
            "passed": self.passed,
            "criteria": [c.summary() for c in self.criteria],
            "timings": {name: t.summary() for name, t in self.timings.items()},
            "leaderboard": self.leaderboard,
            "extra_rounds": self.extra_rounds,
            "cut_short": self.cut_short,
        }


def round_length(new_tokens: int, bench: dict[str, Any], i: int) -> int:
    """How many new tokens round ``i`` (as :func:`interleaved` numbers them, warm-up rounds
    first) of a ``new_tokens`` workload generates under the profile part ``bench``: all of
    them in a timed round; in a warm-up round (``i`` below ``warmup``) ``1 / warmup_share``
    of them (at least 2, at most all; all where the profile sets no share). A warm-up is
    there to take the first run's costs out of the timed ones (code paths run once,
    buffers of the run's shapes allocated, pages touched), which the prefill and the first
    steps already do on a CPU; the cache-free path's later steps only repeat them at a
    growing price (a whole warm-up round was an eighth of a CPU grading)."""
    if i >= bench["warmup"]:
        return new_tokens
    share = int(bench.get("warmup_share", 1))
    return min(new_tokens, max(2, new_tokens // share))


def interleaved(
    run: Callable[[str, int], Sample],
    variants: Sequence[str],
    *,
    warmup: int,
    repeats: int,
    rotate: bool = False,
    until: Callable[[dict[str, Timing]], bool] | None = None,
) -> dict[str, Timing]:
    """Run every variant ``warmup + repeats`` times, one of each per round, and keep the
    last ``repeats`` rounds. ``run(variant, round)`` performs one checked run.
    ``rotate``: round i starts at the i-th variant, so that no variant always runs
    right after the same other one (whose after-effects it would always inherit).
    ``until``: asked after every kept round with the timings so far; True stops there."""
    kept: dict[str, list[Sample]] = {v: [] for v in variants}
    for i in range(warmup + repeats):
        k = i % len(variants) if rotate else 0
        for variant in [*variants[k:], *variants[:k]]:
            sample = run(variant, i)
            if i >= warmup:
                kept[variant].append(sample)
        if i >= warmup and until is not None and until(_timings(kept)):
            break
    return _timings(kept)


def _timings(kept: dict[str, list[Sample]]) -> dict[str, Timing]:
    return {v: Timing(tuple(samples)) for v, samples in kept.items()}


#: The yardstick's runs stop once they lie within this spread of their median
#: ((slowest - fastest) / median, on the verdict's clock): its median is then known well
#: enough to divide by.
STEADY_SPREAD = 0.25
#: The fewest rounds of the yardstick: a spread needs two runs, and the reference's cached
#: runs are the cheapest of a benchmark.
STEADY_ROUNDS = 2


def until_steady(
    run: Callable[[str, int], Sample],
    variants: Sequence[str],
    *,
    warmup: int,
    repeats: int,
    clock: str = "cpu",
) -> dict[str, Timing]:
    """:func:`interleaved` rounds of the reference's runs (the yardstick) until every
    variant's runs are steady: at least :data:`STEADY_ROUNDS` (or ``repeats``, if fewer),
    at most ``repeats``, stopping once each lies within :data:`STEADY_SPREAD`."""
    least = min(STEADY_ROUNDS, repeats)

    def steady(timings: dict[str, Timing]) -> bool:
        rounds = len(next(iter(timings.values())).samples)
        return rounds >= least and all(_steady(t.on(clock)) for t in timings.values())

    return interleaved(run, variants, warmup=warmup, repeats=repeats, until=steady)


def _steady(runs: list[float]) -> bool:
    middle = statistics.median(runs) if runs else 0.0
    return middle > 0 and (max(runs) - min(runs)) / middle <= STEADY_SPREAD


@dataclass(frozen=True)
class Measurement:
    """Interleaved timings of some variants and the criteria judged on them."""

    timings: dict[str, Timing]
    criteria: list[Criterion]
    extra_rounds: int = 0  # rounds added to confirm a miss; the verdict is on all rounds
    cut_short: bool = False  # stopped because ``decided_elsewhere`` said the check is lost


#: Rounds a measurement always takes before its verdict may be settled early. One: a pass
#: needs every criterion cleared by :data:`PASS_MARGIN` in it, which noise (it only adds
#: time, and CPU time barely moves on a busy machine) cannot give a design near or under a
#: limit; a run short of that margin gets more rounds, a miss at least ``MIN_MISS_ROUNDS``.
#: The cache-free runs of the second round were a third of a grading's timed CPU time.
MIN_ROUNDS = 1
#: A criterion met by every run this many times past its limit is settled: more rounds
#: cannot move its median back across the line.
PASS_MARGIN = 1.25
#: A criterion missed by every run this many times short of its limit, over at least
#: ``MIN_MISS_ROUNDS`` rounds, is settled as missed. Wider and later than a pass: noise on
#: a shared machine comes in bursts, and an honest submission must not lose to one.
MISS_MARGIN, MIN_MISS_ROUNDS = 2.0, 3


def _beyond_margins(criterion: Criterion) -> tuple[bool, bool]:
    """Whether every run met ``criterion``'s limit by :data:`PASS_MARGIN`, and whether every
    run missed it by :data:`MISS_MARGIN`. Both False for NaN."""
    r, limit = criterion.ratio, criterion.limit
    worst, best = (r.low, r.high) if criterion.at_least else (r.high, r.low)
    if criterion.at_least:
        return worst >= limit * PASS_MARGIN, best <= limit / MISS_MARGIN
    return worst <= limit / PASS_MARGIN, best >= limit * MISS_MARGIN


def settled(criterion: Criterion, rounds: int) -> bool:
    """Whether ``criterion``'s verdict is decided after ``rounds`` rounds: every run on one
    side of its limit by a margin (:data:`PASS_MARGIN`, :data:`MISS_MARGIN`). False for
    NaN, which keeps measuring and is judged missed in the end."""
    return _beyond_margins(criterion)[0] or missed_for_good(criterion, rounds)


def missed_for_good(criterion: Criterion, rounds: int) -> bool:
    """Whether ``criterion`` is :func:`settled` as missed. One such criterion decides a
    measurement: the check's points need every criterion met, so rounds that only refine
    the others cannot change its verdict."""
    return _beyond_margins(criterion)[1] and rounds >= MIN_MISS_ROUNDS


def measure(
    run: Callable[[str, int], Sample],
    variants: Sequence[str],
    *,
    warmup: int,
    repeats: int,
    judge: Callable[[dict[str, Timing]], list[Criterion]],
    confirm_repeats: int = 0,
    decided_elsewhere: Callable[[], bool] | None = None,
) -> Measurement:
    """Time ``variants`` interleaved, one round at a time, and ``judge`` the timings
    until the verdict is decided (a sequential rule, not a fixed count):

    - after :data:`MIN_ROUNDS` rounds, stop once every criterion is :func:`settled`
      (a reference that passes with a 3-10x margin needs no more), or as soon as one is
      :func:`missed_for_good` (a cache that does not cache, against its yardstick);
    - after ``repeats`` rounds, stop if every criterion is met;
    - otherwise go on, up to ``confirm_repeats`` rounds more, so that one burst of
      background load cannot decide a miss; the verdict is on all rounds;
    - after any round, stop when ``decided_elsewhere()`` says the check is lost whatever
      the timings say (the timed runs' own results: a cache whose calls feed tokens
      again cannot earn the points), with what was measured so far.
    """
    verdict: list[Criterion] = []
    cut = [False]

    def decided(timings: dict[str, Timing]) -> bool:
        rounds = len(next(iter(timings.values())).samples)
        verdict[:] = judge(timings)
        if decided_elsewhere is not None and decided_elsewhere():
            cut[0] = True
            return True
        if rounds >= min(MIN_ROUNDS, repeats) and all(settled(c, rounds) for c in verdict):
            return True
        if any(missed_for_good(c, rounds) for c in verdict):
            return True
        return rounds == repeats and all(c.passed for c in verdict)

    most = repeats + max(0, confirm_repeats)
    timings = interleaved(run, variants, warmup=warmup, repeats=most, until=decided)
    rounds = len(next(iter(timings.values())).samples)
    return Measurement(timings, list(verdict), max(0, rounds - repeats), cut[0])
