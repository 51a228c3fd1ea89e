"""Part 4's latency judgements (grader/parts/part4/latency.py and latency_clock.py):
measure_latency's figures against the grader's clock around the call, and exactly on the
clock the adapter drives from the model calls. Each known mistake is judged wrong and, where
its figures are its own, named; NaN never passes."""

from __future__ import annotations

import math
import statistics

import pytest

from grader.parts.part4.latency import (
    RUN_COUNT_CASE,
    follows_call_pattern,
    judge_latency,
    latency_figures,
    run_count_problem,
)
from grader.parts.part4.latency_clock import (
    AVERAGES,
    CLOCKED_CASES,
    UNTIMED_STARTS,
    clocked_figures,
    clocked_problem,
    same_figures,
)

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


# ------------------------------------------------------------------ the driven clock

HYPOTHESES = {
    (w, r, first, batch)
    for w in range(4)
    for r in range(1, 6)
    for first in (False, True)
    for batch in (1, 2)
    if not (first and r == 1)  # one timed run: the first is the median
}


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
def test_every_run_count_single_run_and_batch_gives_figures_of_its_own(case) -> None:
    figures = {
        h: clocked_figures(case, batch=h[3], warmup=h[0], repeats=h[1], first_only=h[2])
        for h in HYPOTHESES
    }
    keys = sorted(figures)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not same_figures(figures[a], figures[b]), (a, b)


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
def test_an_untimed_start_or_the_mean_is_accepted_and_no_mistake_passes_for_one(case) -> None:
    """Untimed generations before the loop over L (a warm-up pass of the lab's own) are
    extra untimed work, which is allowed, and the course lab's "average latency" (the
    mean) is as good as the handout's median; no wrong run count, single timed run or
    batch gives the figures of any such reading, so accepting them lets no mistake
    through."""
    s = case.settings
    right = (s["warmup"], s["repeats"], False, 1)
    for start in UNTIMED_STARTS:
        for average in AVERAGES:
            figures = clocked_figures(case, start=start, average=average)
            assert clocked_problem(case, figures) == ("", None), (start, average)
            for h in HYPOTHESES - {right}:
                mistake = clocked_figures(case, batch=h[3], warmup=h[0], repeats=h[1],
                                          first_only=h[2])  # fmt: skip
                assert not same_figures(mistake, figures), (start, average, h)


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
def test_the_mean_and_the_median_differ_on_the_driven_clock(case) -> None:
    # Otherwise accepting the mean would be a test that cannot fail.
    assert not same_figures(clocked_figures(case), clocked_figures(case, average=statistics.mean))


def test_a_failure_names_the_first_wrong_figure() -> None:
    case = CLOCKED_CASES[1]
    figures = clocked_figures(case)
    figures["cache_ms_per_token"][1] *= 1.5
    problem, _ = clocked_problem(case, figures)
    L = case.L_values[1]
    assert f"cache_ms_per_token at L = {L} is" in problem and "where that clock gives" in problem


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
def test_no_figure_is_near_a_whole_number_of_ms(case) -> None:
    """So a figure rounded down to whole milliseconds is always another number."""
    for values in clocked_figures(case).values():
        assert all(0.05 <= x % 1 <= 0.95 for x in values), values


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
def test_the_handouts_loop_passes(case) -> None:
    assert clocked_problem(case, clocked_figures(case)) == ("", None)


def test_known_mistakes_fail_and_are_told() -> None:
    case = CLOCKED_CASES[1]  # the handout's defaults: warmup 1, repeats 3
    want = clocked_figures(case)
    told = {
        "latency_no_warmup": clocked_figures(case, warmup=0, repeats=3),
        "first timed run": clocked_figures(case, first_only=True),
        "2 rows": clocked_figures(case, batch=2),
        "rounded down": {k: [float(math.floor(x)) for x in v] for k, v in want.items()},
        "latency_totals": {
            k: [x * L for x, L in zip(v, case.L_values, strict=True)] for k, v in want.items()
        },
        "2 warm-up and 3 timed": clocked_figures(case, warmup=2, repeats=3),
    }
    for expect, figures in told.items():
        problem, name = clocked_problem(case, figures)
        assert problem
        assert expect == name or expect in problem, (expect, problem)


def test_suspect_defaults_are_pointed_at_and_nan_fails() -> None:
    case = CLOCKED_CASES[1]
    odd = {k: [x * 1.01 for x in v] for k, v in clocked_figures(case).items()}
    problem, name = clocked_problem(case, odd, defaults_only=True)
    assert name is None and "the defaults must be the handout's" in problem
    nan = {k: [math.nan for _ in v] for k, v in clocked_figures(case).items()}
    assert clocked_problem(case, nan)[0]


def test_every_clocked_case_gives_every_generation_a_second_call() -> None:
    for case in CLOCKED_CASES:
        assert min(case.L_values) >= 2 and case.settings["prompt_len"] >= 2


@pytest.mark.parametrize(
    ("lengths", "cached", "ok"),
    [
        ([8, 1, 1], True, True),
        ([8, 9, 10], False, True),
        ([8, 9, 10], True, False),  # the whole sequence again, with the cache
        ([8, 1], True, False),  # a call short
        (None, False, False),
    ],
)
def test_the_call_pattern_is_the_handouts(lengths, cached: bool, ok: bool) -> None:
    assert follows_call_pattern(lengths, 8, 3, cached) is ok


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
def test_a_warm_up_of_its_own_is_accepted_only_where_the_clock_saw_one(case) -> None:
    """Every one of the `repeats` runs timed, after a warm-up of the lab's own (model
    passes, which leave no mark on the driven clock): right where the grader's clock saw
    the warm-up (own_warmup), the known no-warm-up mistake otherwise; no other mistake
    gives the figures of such a reading."""
    s = case.settings
    accepted = {(0, s["repeats"], False, 1), (s["warmup"], s["repeats"], False, 1)}
    for start in UNTIMED_STARTS:
        for average in AVERAGES:
            figures = clocked_figures(case, warmup=0, start=start, average=average)
            assert clocked_problem(case, figures, own_warmup=True) == ("", None)
            if start == (0, 0) and average is statistics.median:
                assert clocked_problem(case, figures)[1] == "latency_no_warmup"
            for h in HYPOTHESES - accepted:
                mistake = clocked_figures(case, batch=h[3], warmup=h[0], repeats=h[1],
                                          first_only=h[2])  # fmt: skip
                assert not same_figures(mistake, figures), (start, average, h)


def test_run_counts_accept_repeats_alone_only_after_a_warm_up_of_its_own() -> None:
    case = RUN_COUNT_CASE
    timed_only = [L for L in case["L_values"] for _ in range(case["repeats"])]
    calls = {"no_cache": timed_only, "cache": timed_only}
    assert run_count_problem(calls, case, own_warmup=True) == ""
    problem = run_count_problem(calls, case)
    assert problem and "must run warmup + repeats = 7 times for every L" in problem
    hard_coded = [L for L in case["L_values"] for _ in range(4)]  # the handout's 1 + 3
    assert run_count_problem({"no_cache": hard_coded, "cache": hard_coded}, case, own_warmup=True)
