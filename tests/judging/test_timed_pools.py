"""The work probe shared by Parts 2 and 3: interleaved rounds, stopped early only when
the verdict cannot change."""

from __future__ import annotations

import math

import pytest

from grader.judging.timed_pools import WITH, WITHOUT, TimedPools, decided
from grader.runtime.timing import Ratio, Sample


def probe(cpu: dict[bool, list[float]], rounds: int, threshold: float | None):
    """Run the probe on scripted CPU seconds (by use_cache, per round); the calls made."""
    calls: list[tuple[bool, int]] = []

    def run(use_cache: bool, i: int) -> Sample:
        calls.append((use_cache, i))
        return Sample(seconds=1.0, cpu_seconds=cpu[use_cache][i])

    ratio, timings = TimedPools().interleaved_work(rounds, run, threshold)
    return ratio, timings, calls


def test_a_ratio_far_past_the_threshold_stops_after_one_round() -> None:
    ratio, timings, calls = probe({False: [1.2, 1.2, 1.2], True: [0.1, 0.1, 0.1]}, 3, 3.0)
    assert calls == [(False, 0), (True, 0)]
    assert ratio.median == pytest.approx(12.0)
    assert len(timings[WITHOUT].samples) == len(timings[WITH].samples) == 1


def test_a_ratio_far_below_the_threshold_stops_after_one_round() -> None:
    _, _, calls = probe({False: [1.0, 1.0], True: [1.0, 1.0]}, 2, 3.0)
    assert calls == [(False, 0), (True, 0)]


def test_a_ratio_near_the_threshold_runs_every_round() -> None:
    ratio, _, calls = probe({False: [3.5, 2.0, 3.4], True: [1.0, 1.0, 1.0]}, 3, 3.0)
    assert calls == [(use, i) for i in range(3) for use in (False, True)]
    assert ratio.median == pytest.approx(3.4)


def test_without_a_threshold_every_round_runs() -> None:
    _, _, calls = probe({False: [9.0, 9.0], True: [0.1, 0.1]}, 2, None)
    assert len(calls) == 4


def test_nan_is_never_decided() -> None:
    nan = Ratio(math.nan, math.nan, math.nan)
    assert not decided(nan, 3.0) and not decided(nan, 3.0, at_least=False)


def test_a_pass_is_decided_nearer_the_line_than_a_miss() -> None:
    """At least 3x: 4.5x passes at once, a miss must be 1.5x or less; at most 2x (the
    growth probe): 1.33x passes at once, a miss must be 4x or more."""
    assert decided(Ratio(4.5, 4.5, 4.5), 3.0) and decided(Ratio(1.5, 1.5, 1.5), 3.0)
    assert not decided(Ratio(4.4, 4.4, 4.4), 3.0) and not decided(Ratio(1.6, 1.6, 1.6), 3.0)
    assert decided(Ratio(1.3, 1.3, 1.3), 2.0, at_least=False)
    assert decided(Ratio(4.0, 4.0, 4.0), 2.0, at_least=False)
    assert not decided(Ratio(1.4, 1.4, 1.4), 2.0, at_least=False)
    assert not decided(Ratio(3.9, 3.9, 3.9), 2.0, at_least=False)


def test_cached_growth_is_cpu_per_token_of_the_long_run_over_the_short_one() -> None:
    calls: list[tuple[int, int]] = []

    def run(new_tokens: int, i: int) -> Sample:
        calls.append((new_tokens, i))
        per_token = 0.001 if new_tokens == 32 else 0.003  # a path that recomputes the prefix
        return Sample(seconds=9.0, cpu_seconds=per_token * new_tokens)

    growth = TimedPools.cached_growth(2, run, 32, 256)
    assert calls == [(32, 0), (256, 0), (32, 1), (256, 1)]
    assert growth.median == pytest.approx(3.0)
    nan = TimedPools.cached_growth(1, lambda n, i: Sample(1.0, cpu_seconds=math.nan), 8, 64)
    assert not nan.median <= 10.0  # a NaN figure never passes a maximum


def test_cached_growth_with_a_threshold_measures_more_rounds_only_near_the_line() -> None:
    def probe(first_round: float, later: float) -> tuple[float, list[tuple[int, int]]]:
        calls: list[tuple[int, int]] = []

        def run(new_tokens: int, i: int) -> Sample:
            calls.append((new_tokens, i))
            growth = first_round if i == 0 else later
            per_token = 0.001 * (growth if new_tokens == 256 else 1.0)
            return Sample(seconds=1.0, cpu_seconds=per_token * new_tokens)

        return TimedPools.cached_growth(3, run, 32, 256, threshold=3.0).median, calls

    growth, calls = probe(1.0, 9.0)  # far below the maximum: decided by one round
    assert growth == pytest.approx(1.0) and calls == [(32, 0), (256, 0)]
    growth, calls = probe(8.0, 1.0)  # far above it: decided too
    assert growth == pytest.approx(8.0) and len(calls) == 2
    growth, calls = probe(2.5, 1.2)  # near the line: three more rounds, and they alone decide
    assert growth == pytest.approx(1.2)
    assert calls == [(n, i) for i in range(4) for n in (32, 256)]


def test_cached_growth_whose_first_round_counts_stays_within_its_rounds() -> None:
    """Part 2's probe (its pool holds three rounds): decided in one round, or three in
    all, judged on all three, exactly as without a threshold."""

    def probe(growths: list[float]) -> tuple[float, list[tuple[int, int]]]:
        calls: list[tuple[int, int]] = []

        def run(new_tokens: int, i: int) -> Sample:
            calls.append((new_tokens, i))
            per_token = 0.001 * (growths[i] if new_tokens == 256 else 1.0)
            return Sample(seconds=1.0, cpu_seconds=per_token * new_tokens)

        growth = TimedPools.cached_growth(3, run, 32, 256, threshold=2.0, first_counts=True)
        return growth.median, calls

    growth, calls = probe([0.9, 9.0, 9.0])  # far below the maximum: one round
    assert growth == pytest.approx(0.9) and calls == [(32, 0), (256, 0)]
    growth, calls = probe([5.0, 1.0, 1.0])  # far above it: one round
    assert growth == pytest.approx(5.0) and len(calls) == 2
    growth, calls = probe([1.6, 2.6, 1.1])  # near the line: the median of all three
    assert growth == pytest.approx(1.6)
    assert calls == [(n, i) for i in range(3) for n in (32, 256)]


class GrowthStub(TimedPools):
    """A part whose growth probe measured ``growth`` and whose runs' calls say ``calls``."""

    max_cached_growth = 2.0
    growth_shape = (8, 8, 16, 248)
    growth_label = "cached"

    def __init__(self, growth: float, calls: str) -> None:
        self.growth, self.calls = growth, calls

    def growth_probe(self) -> Ratio:
        return Ratio(self.growth, self.growth, self.growth)

    def growth_advice(self, growth: Ratio) -> str:
        return "grew"

    def growth_calls_problem(self) -> str:
        return self.calls


@pytest.mark.parametrize(
    ("growth", "calls", "problem"),
    [(1.0, "", ""), (1.0, "started over", "started over"), (3.0, "started over", "grew"),
     (math.nan, "", "grew")],
)  # fmt: skip
def test_a_flat_growth_still_needs_its_runs_calls_to_be_a_caches(
    growth: float, calls: str, problem: str
) -> None:
    """The growth runs' call records are judged once their cost per token is flat: a
    generate that starts over every few steps can stay under the maximum."""
    assert GrowthStub(growth, calls).measure_growth() == problem
