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
of a few hundred milliseconds can swallow several 10 ms runs in a row. So rounds
go on until each criterion's confidence bound clears its limit (``measure``; the
rules and their reasons are :mod:`grader.runtime.verdicts`): a correct submission
outvotes a burst, a cache that does not cache stays near 1x however many rounds are
timed, and a criterion the rounds never decide says so in the results.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from grader.runtime.series import Ratio, Sample, Timing
from grader.runtime.verdicts import (
    MEDIAN_MISSED,
    MISSED,
    NOT_DECIDED,
    OWN_NOISE,
    PASSING,
    UNDECIDED,
    VerdictSettings,
    early_decision,
    final_decision,
    machine_noise,
    verdict_settings,
)

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
class Criterion:
    """One threshold of a benchmark check, applied to a ratio.

    ``key`` is where the threshold lives in a profile of ``thresholds.toml``
    (``part3.min_speedup.8``), so calibration can propose a new value for it.
    ``decision`` is what :func:`measure` decided (:mod:`grader.runtime.verdicts`), after
    ``rounds`` rounds (``late``: only in the confirmation rounds), with the bound it
    decided on; without one (a criterion judged outside a measurement) the median decides.
    """

    key: str
    label: str
    ratio: Ratio
    limit: float
    at_least: bool  # True: the ratio must reach the limit; False: stay within it
    decision: str = ""
    rounds: int = 0
    late: bool = False
    bound: tuple[float, float] | None = None

    @property
    def passed(self) -> bool:
        if self.decision:
            return self.decision in PASSING
        if self.at_least:
            return self.ratio.median >= self.limit
        return self.ratio.median <= self.limit

    @property
    def undecided(self) -> bool:
        """Whether its runs never decided it (see :mod:`grader.runtime.verdicts`)."""
        return self.decision in NOT_DECIDED

    def describe(self) -> str:
        need = "at least" if self.at_least else "at most"
        mark = "ok" if self.passed else "NOT MET"
        return f"{self.label}: {self.ratio}, needed {need} {self.limit:g}x [{mark}]{self.note()}"

    def note(self) -> str:
        """What the decision adds to :meth:`describe`, in plain words ("" when decided in
        the ordinary rounds)."""
        if self.decision == UNDECIDED:
            return " (undecided: this machine was too noisy to tell; kept as met)"
        if self.decision == OWN_NOISE:
            return " (undecided: your runs were far noisier than the reference's here)"
        if self.decision == MEDIAN_MISSED:
            return " (undecided: judged on the median)"
        return f" (decided after {self.rounds} rounds)" if self.late else ""

    def decided(
        self, decision: str, rounds: int, late: bool, bound: tuple[float, float]
    ) -> Criterion:
        """This criterion with ``decision`` recorded."""
        return replace(self, decision=decision, rounds=rounds, late=late, bound=bound)

    def summary(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "undecided": self.undecided}


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
    #: Why the reference's timings (the yardstick) are missing: the check was judged
    #: without the comparison with them, a grader fault (grader/judging/yardstick.py).
    grader_fault: str = ""

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

    @property
    def undecided(self) -> list[str]:
        """The labels of the criteria its runs never decided (a TA may time them again),
        and the comparison with the reference where its timings could not be measured."""
        missing = (
            ["over the reference's (not measured: a grader fault)"] if self.grader_fault else []
        )
        return [c.label for c in self.criteria if c.undecided] + missing

    @property
    def decided_late(self) -> list[str]:
        """The labels of the criteria decided only in the confirmation rounds."""
        return [c.label for c in self.criteria if c.late and not c.undecided]

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
            "undecided": self.undecided,
            "decided_late": self.decided_late,
            "grader_fault": self.grader_fault,
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
    extra_rounds: int = 0  # rounds past ``repeats`` that deciding took
    cut_short: bool = False  # stopped because ``decided_elsewhere`` said the check is lost


#: Rounds a measurement always takes before its verdict may be decided: one, since a
#: pass needs a confidence bound that clears its limit (:mod:`grader.runtime.verdicts`),
#: which a design near or under a limit cannot give. The cache-free runs of the second
#: round were a third of a grading's timed CPU time.
MIN_ROUNDS = 1


def decide_round(
    verdict: list[Criterion],
    kept: dict[tuple[str, str], Criterion],
    rounds: int,
    late: bool,
    settings: VerdictSettings,
) -> None:
    """Keep in ``kept`` (by key and label) each criterion of ``verdict`` that ``rounds``
    rounds decide, as it stood then: a decided criterion is not judged again."""
    machine = machine_noise([c.ratio for c in verdict], settings.noise_floor)
    for c in verdict:
        if (c.key, c.label) not in kept:
            found, bound = early_decision(c.ratio, c.limit, c.at_least, rounds, machine, settings)
            if found:
                kept[(c.key, c.label)] = c.decided(found, rounds, late, bound)


def final_verdict(
    verdict: list[Criterion],
    kept: dict[tuple[str, str], Criterion],
    rounds: int,
    late: bool,
    settings: VerdictSettings,
    open_ended: bool,
) -> list[Criterion]:
    """Every criterion as decided: those ``kept``, the others decided at the cap
    (:func:`grader.runtime.verdicts.final_decision`), unless the check is lost anyway
    (``open_ended``: a miss or the runs' own calls), where they keep their median."""
    machine = machine_noise([c.ratio for c in verdict], settings.noise_floor)
    out = []
    for c in verdict:
        if (c.key, c.label) in kept:
            out.append(kept[(c.key, c.label)])
        elif open_ended:
            out.append(c)
        else:
            found, bound = final_decision(c.ratio, c.limit, c.at_least, machine, settings)
            out.append(c.decided(found, rounds, late, bound))
    return out


def decided_once(criterion: Criterion) -> Criterion:
    """``criterion`` decided on the runs already timed, their count its cap (a probe's,
    timed in rounds of its own): its bound, or else who made the noise."""
    settings = verdict_settings()
    rounds = criterion.ratio.runs
    return final_verdict([criterion], {}, rounds, False, settings, False)[0]


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
    after each round until the verdict is decided (:mod:`grader.runtime.verdicts`):

    - each criterion is decided once its confidence bound clears its limit (a pass from
      the first round, a miss after ``min_miss_rounds``) and then kept as it stood;
    - the rounds stop once every criterion passed, or as soon as one missed (the
      check's points need every criterion);
    - at the cap, ``repeats + confirm_repeats`` rounds, the undecided ones are decided
      by their median's bound, or else by who made the noise;
    - after any round, stop when ``decided_elsewhere()`` says the check is lost whatever
      the timings say (the timed runs' own results: a cache whose calls feed tokens
      again cannot earn the points), with what was measured so far.
    """
    settings = verdict_settings()
    verdict: list[Criterion] = []
    kept: dict[tuple[str, str], Criterion] = {}
    cut = [False]

    def decided(timings: dict[str, Timing]) -> bool:
        rounds = len(next(iter(timings.values())).samples)
        verdict[:] = judge(timings)
        if decided_elsewhere is not None and decided_elsewhere():
            cut[0] = True
            return True
        if rounds >= min(MIN_ROUNDS, repeats):
            decide_round(verdict, kept, rounds, rounds > repeats, settings)
        lost = any(c.decision == MISSED for c in kept.values())
        return lost or len(kept) == len(verdict)

    most = repeats + max(0, confirm_repeats)
    timings = interleaved(run, variants, warmup=warmup, repeats=most, until=decided)
    rounds = len(next(iter(timings.values())).samples)
    lost = cut[0] or any(c.decision == MISSED for c in kept.values())
    criteria = final_verdict(verdict, kept, rounds, rounds > repeats, settings, lost)
    return Measurement(timings, criteria, max(0, rounds - repeats), cut[0])
