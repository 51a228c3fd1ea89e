"""Part 4's judgements on raw data (grader/parts/part4/support.py): the int8 cache's
format, memory, error and tokens, and measure_latency's figures against the grader's
clock. Each known mistake is judged wrong and named; the handout's format passes;
NaN never passes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grader.parts.part4.support import (
    expected_int8,
    judge_int8,
    judge_latency,
    latency_figures,
    plain_value,
)

RNG = np.random.default_rng(7)
ORIGINALS = [RNG.normal(size=(1, 4, 5, 64)).astype(np.float32) * s for s in (0.5, 3.0, 1.0, 2.0)]
TOKENS = np.arange(16, dtype=np.int64)[None, :]


def quantised(mistake: str = "") -> tuple[list[np.ndarray], list[str]]:
    """The handout's format for ORIGINALS (or one known mistake): int8 data and float16
    scales per layer, as the worker sends them back."""
    arrays, dtypes = [], []
    for x in ORIGINALS:
        q, scale = expected_int8(x)
        if mistake == "truncates":
            q = np.clip(np.trunc(x / scale.astype(np.float32)), -127, 127).astype(np.int8)
        if mistake == "per_tensor":
            scale = np.array([[[[np.abs(x).max() / 127]]]], dtype=np.float16)
            q = np.clip(np.round(x / scale.astype(np.float32)), -127, 127).astype(np.int8)
        if mistake == "float32_scales":  # a correct variant: q from the unrounded scale
            scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / 127, 1e-8)
            q = np.clip(np.round(x / scale), -127, 127).astype(np.int8)
            scale = scale.astype(np.float32)
        if mistake == "uint8":
            q, scale = x.astype(np.uint8), None
        arrays.append(q)
        dtypes.append(str(q.dtype))
        if scale is not None:
            arrays.append(scale)
            dtypes.append(str(scale.dtype))
    return arrays, dtypes


def judge(mistake: str = "", reported: int | None = None, restored=None, tokens=TOKENS):
    arrays, dtypes = quantised(mistake)
    total = sum(a.nbytes for a in arrays)
    if restored is None:
        restored = [
            arrays[i].astype(np.float32) * arrays[i + 1].astype(np.float32)
            for i in range(0, len(arrays), 2)
        ]
    reported = total if reported is None else reported
    return judge_int8(ORIGINALS, arrays, dtypes, reported, restored, tokens, TOKENS)


def test_the_handouts_format_passes() -> None:
    v = judge()
    assert v.passed, v.failures(16)
    assert v.ratio == pytest.approx((1 + 2 / 64) / 2)  # int8 data, a float16 per 64 values
    assert v.max_error <= 0.5 / 127 + 1e-6
    assert v.agreement == 1.0


def test_scales_kept_in_float32_pass() -> None:
    v = judge("float32_scales")
    assert v.passed, v.failures(16)


@pytest.mark.parametrize(
    ("mistake", "name"),
    [
        ("truncates", "int8_truncates"),
        ("per_tensor", "int8_per_tensor_scale"),
        ("uint8", "uint8_cast"),
    ],
)
def test_a_format_mistake_fails_and_is_named(mistake: str, name: str) -> None:
    v = judge(mistake)
    assert not v.passed
    assert name in v.mistakes


def test_bytes_without_the_scales_fail_and_are_named() -> None:
    arrays, _ = quantised()
    data_only = sum(a.nbytes for a in arrays if a.dtype == np.int8)
    v = judge(reported=data_only)
    assert not v.passed
    assert v.mistakes == ["int8_bytes_without_scales"]
    assert "quantized_kv_bytes returned" in v.failures(16)[0]


def test_nan_never_passes() -> None:
    nan_cache = [np.full_like(x, np.nan) for x in ORIGINALS]
    v = judge(restored=nan_cache)
    assert math.isnan(v.max_error) and not v.passed
    assert not judge(tokens=None).passed  # no tokens: agreement stays NaN


def test_the_agreement_is_counted_by_the_grader() -> None:
    wrong = TOKENS.copy()
    wrong[0, :4] += 1
    v = judge(tokens=wrong)
    assert v.agreement == pytest.approx(12 / 16)
    assert not v.passed


# ----------------------------------------------------------------- measure_latency

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


def test_plain_value_decodes_the_workers_encoding() -> None:
    enc = {
        "kind": "dict",
        "value": {
            "L": {"kind": "list", "value": [{"kind": "int", "value": 8}]},
            "x": {"kind": "list", "value": [{"kind": "float", "value": "nan"}]},
        },
    }
    value = plain_value(enc)
    assert value["L"] == [8] and math.isnan(value["x"][0])
