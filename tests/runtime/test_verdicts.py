"""The sequential decision on synthetic run series: honest runs under a noisy machine are
never failed, cache-free runs made noisy on purpose never pass, clear cases stop early.

Every series is drawn from a seeded generator, so each test is the same every time; no
test reads a clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from grader.runtime.timing import (
    BenchmarkRecord,
    Criterion,
    Ratio,
    Sample,
    Timing,
    decided_once,
    measure,
)
from grader.runtime.verdicts import (
    MEDIAN_MISSED,
    MISSED,
    NOT_DECIDED,
    OWN_NOISE,
    PASSED,
    UNDECIDED,
    final_decision,
    log_sigma,
    verdict_settings,
)

SPEEDUP, VERSUS = 3.47, 2.2  # the limits the synthetic checks are judged by (Part 2's)
SEEDS = range(300)
Noise = Callable[[random.Random, list[bool] | None], float]


def busy_machine(rng: random.Random, hits: list[bool] | None = None) -> float:
    """A shared machine: a few per cent of jitter, and one run in seven caught by a burst
    that makes it 1.2-2.5 times as long (noise only adds time); ``hits`` records which."""
    hit = rng.random() < 0.15
    if hits is not None:
        hits.append(hit)
    return rng.lognormvariate(0.0, 0.05) * (rng.uniform(1.2, 2.5) if hit else 1.0)


def spins_at_random(rng: random.Random, hits: list[bool] | None = None) -> float:
    """A submission that sleeps or spins a random amount in half of its runs."""
    return busy_machine(rng, hits) * (rng.uniform(1.0, 10.0) if rng.random() < 0.5 else 1.0)


def quiet(rng: random.Random, _hits: list[bool] | None = None) -> float:
    """A quiet machine: a few per cent of jitter."""
    return rng.lognormvariate(0.0, 0.03)


def graded(
    seed: int,
    cached: float,
    plain: float,
    own: Noise,
    hits: list[bool] | None = None,
    machine: Noise = busy_machine,
) -> list[Criterion]:
    """One synthetic 2.11: the reference's cached runs take 1.0 (three runs, timed first
    on the busy machine), the submission's ``cached`` and ``plain`` (cache-free) runs take
    those times, each run with the noise ``own`` adds (``hits``: which cached runs a burst
    caught; ``machine``: the reference's noise); warm-up 1, repeats 3, 6 more."""
    rng = random.Random(seed)
    reference = Timing(tuple(Sample(machine(rng, None)) for _ in range(3)))
    base = {"plain": plain, "cached": cached}

    def run(variant: str, i: int) -> Sample:
        caught = hits if variant == "cached" and i > 0 else None
        return Sample(base[variant] * own(rng, caught))

    def judge(timings: dict[str, Timing]) -> list[Criterion]:
        cached_runs = timings["cached"]
        return [
            Criterion("s", "speedup", Ratio.of(timings["plain"], cached_runs), SPEEDUP, True),
            Criterion("r", "vs reference", Ratio.against(cached_runs, reference), VERSUS, False),
        ]

    return measure(run, ["plain", "cached"], warmup=1, repeats=3, judge=judge,
                   confirm_repeats=6).criteria  # fmt: skip


def test_honest_runs_under_bursts_of_machine_noise_are_never_failed() -> None:
    """The reference is as noisy as the submission (same machine, same bursts): whatever
    the bursts hit, the reference's own cache keeps its points, decided or flagged."""
    verdicts = [graded(seed, 1.0, 12.0, busy_machine) for seed in SEEDS]
    assert all(c.passed for criteria in verdicts for c in criteria)
    decided = sum(all(c.decision == PASSED for c in criteria) for criteria in verdicts)
    assert decided >= 0.9 * len(SEEDS)  # undecided stays the exception, for a TA to see


def test_a_slower_honest_cache_loses_only_where_most_of_its_runs_were_slowed() -> None:
    """A cache 1.6x as slow as the reference (5x its own speedup) keeps its points unless
    bursts caught most of its timed cached runs and none of the reference's: a shift no
    rule that compares with a reference timed before can tell from a slower cache, and
    rare (the stability runs on a busy machine say how rare)."""
    lost = 0
    for seed in SEEDS:
        hits: list[bool] = []
        if not all(c.passed for c in graded(seed, 1.6, 8.0, busy_machine, hits)):
            lost += 1
            assert sum(hits) > len(hits) / 2, (seed, hits)
    assert lost <= 0.01 * len(SEEDS)


def test_cache_free_runs_made_noisy_on_purpose_never_pass() -> None:
    """A cache-free path slowed on purpose (its speedup faked at 5x) whose runs also sleep
    or spin at random: however the noise falls, the check is lost."""
    verdicts = [graded(seed, 8.0, 40.0, spins_at_random) for seed in SEEDS]
    assert not any(all(c.passed for c in criteria) for criteria in verdicts)
    versus = [criteria[1] for criteria in verdicts]
    assert not any(c.passed for c in versus)
    assert {c.decision for c in versus} <= {MISSED, OWN_NOISE, MEDIAN_MISSED}


def test_a_noisy_cache_free_path_cannot_buy_the_speedup() -> None:
    """A cache that does not cache (1x, its cached runs 6x the reference's), spinning at
    random to widen the bound: the check is never passed as the machine's noise."""
    verdicts = [graded(seed, 6.0, 6.0, spins_at_random) for seed in SEEDS]
    assert not any(all(c.passed for c in criteria) for criteria in verdicts)
    assert not any(criteria[1].passed for criteria in verdicts)  # its cached runs: 6x


def test_clear_passes_and_misses_stop_early() -> None:
    """The reference passes in the first round; a cache that does not cache misses after
    min_miss_rounds, both well before the cap."""
    least = verdict_settings().min_miss_rounds
    for seed in range(20):
        passed = graded(seed, 1.0, 12.0, quiet, machine=quiet)
        assert [c.rounds for c in passed] == [1, 1]
        missed = graded(seed, 12.0, 12.0, quiet, machine=quiet)
        assert any(c.decision == MISSED and c.rounds == least for c in missed)


def test_who_made_the_noise_decides_an_undecided_criterion() -> None:
    """At the cap, the same undecided ratio passes where the reference was as noisy and
    fails where the submission's runs alone were."""
    s = verdict_settings()
    ratio = Ratio(2.1, 1.2, 3.6, 9, 0.35, 0.35, False, 3, 0.3)
    assert final_decision(ratio, VERSUS, False, 0.3, s)[0] == UNDECIDED
    quiet = Ratio(2.1, 1.2, 3.6, 9, 0.35, 0.35, False, 3, 0.03)
    assert final_decision(quiet, VERSUS, False, 0.03, s)[0] == OWN_NOISE
    assert final_decision(quiet, VERSUS, False, None, s)[0] in NOT_DECIDED


def test_undecided_criteria_are_named_in_the_record() -> None:
    undecided = Criterion("r", "vs reference", Ratio(2.1, 1.2, 3.6), VERSUS, False, UNDECIDED, 9)
    late = Criterion("s", "speedup", Ratio(4.0, 3.0, 5.0), SPEEDUP, True, PASSED, 5, True)
    record = BenchmarkRecord("2.11", "cpu", [late, undecided])
    summary = record.summary()
    assert summary["passed"] and summary["undecided"] == ["vs reference"]
    assert summary["decided_late"] == ["speedup"]
    assert "undecided" in undecided.describe() and "after 5 rounds" in late.describe()


def test_the_log_spread_ignores_one_stalled_run() -> None:
    assert log_sigma([1.0]) is None
    assert log_sigma([1.0, 1.0, 1.0, 5.0]) == pytest.approx(0.0)
    assert log_sigma([1.0, 2.0]) == pytest.approx(1.4826 * 0.5 * 0.6931, rel=1e-3)


def test_a_probe_of_fixed_rounds_is_decided_on_the_runs_it_has() -> None:
    """The work probe's cached runs against the reference's (3.7, 2.9): a clear case is
    decided, one that a noisy reference cannot settle is flagged, by who made the noise."""
    cached = Timing(tuple(Sample(s) for s in (1.0, 1.02)))
    steady = Timing(tuple(Sample(s) for s in (0.5, 0.51)))
    clear = decided_once(Criterion("r", "vs reference", Ratio.against(cached, steady), 2.2, False))
    assert clear.decision == PASSED and clear.rounds == 2
    noisy = Timing(tuple(Sample(s) for s in (0.35, 0.65)))
    flagged = decided_once(Criterion("r", "vs reference", Ratio.against(cached, noisy), 2.2, False))
    assert flagged.undecided and flagged.passed  # its median, 2.02x, is within the limit
