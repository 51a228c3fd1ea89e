"""Part 4's latency judgements (grader/parts/part4/latency.py): measure_latency's figures
against the grader's clock around the call. Each known mistake is judged wrong and, where
its figures are its own, named; NaN never passes. The timed cases (latency_clock.py) are
in test_latency_timed.py."""

from __future__ import annotations

import pytest

from grader.parts.part4.latency import judge_latency, latency_figures

L_VALUES = [8, 24]


def figures(cached_ms: float, free_ms: float) -> dict[str, list[float]]:
    return {"no_cache_ms_per_token": [free_ms] * 2, "cache_ms_per_token": [cached_ms] * 2}


def test_per_token_figures_after_a_warm_up_fit_the_clock() -> None:
    # 4 timed runs of 8 or 24 tokens at 1-2 ms/token: 0.096 s; as much again in warm-ups
    v, _ = judge_latency(figures(1.0, 2.0), L_VALUES, 1, wall_s=1.0 + 0.2, delay_s=1.0)
    assert v.passed and v.mistake(0.0) is None


def test_totals_fail_and_are_named() -> None:
    totals = {
        k: [x * L for x, L in zip(v, L_VALUES, strict=True)] for k, v in figures(1.0, 2.0).items()
    }
    v, totals_share = judge_latency(totals, L_VALUES, 1, wall_s=1.2, delay_s=1.0)
    assert not v.passed
    assert v.mistake(totals_share) == "latency_totals"


def test_a_timed_first_run_fails_and_is_named() -> None:
    # no warm-up: the first figure holds the grader's 1 s delay
    f = figures(1.0, 2.0)
    f["no_cache_ms_per_token"][0] += 1000 / L_VALUES[0]
    v, totals_share = judge_latency(f, L_VALUES, 1, wall_s=1.0 + 0.1, delay_s=1.0)
    assert not v.passed
    assert v.mistake(totals_share) == "latency_no_warmup"


def test_seconds_instead_of_milliseconds_fail() -> None:
    v, _ = judge_latency(figures(0.001, 0.002), L_VALUES, 1, wall_s=1.2, delay_s=1.0)
    assert not v.passed


@pytest.mark.parametrize(
    "bad",
    [
        {
            "L": [8, 24],
            "no_cache_ms_per_token": [float("nan"), 1.0],
            "cache_ms_per_token": [1.0, 1.0],
        },
        {"L": [8, 24], "no_cache_ms_per_token": [1.0], "cache_ms_per_token": [1.0, 1.0]},
        {"L": [32, 64], "no_cache_ms_per_token": [1.0, 1.0], "cache_ms_per_token": [1.0, 1.0]},
        [1.0, 2.0],
    ],
)
def test_malformed_or_nan_figures_are_refused(bad) -> None:
    got, problem = latency_figures(bad, L_VALUES)
    assert problem and not got
