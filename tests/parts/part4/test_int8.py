"""Part 4's int8 judgements on raw data (grader/parts/part4/int8.py): the int8 cache's
format, memory, error and tokens on the model's fp32 cache, and the round trip of the
made-up float16 cache with all-zero vectors. Each known mistake is judged wrong and
named; the handout's format and its reasonable variants pass; NaN never passes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grader.core.arrays import decode_array
from grader.parts.part4.build import int8_cache_case
from grader.parts.part4.int8 import expected_int8, judge_int8, judge_int8_cache

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


# ------------------------------------------------ the made-up float16 cache (round trip)

EDGE = [decode_array(t).astype(np.float16) for t in int8_cache_case()["cache"]]


def round_trip(
    zero_scale: float | None = None, clamp: tuple[int, int] = (-127, 127), dtype: str = "float16"
) -> tuple[list[np.ndarray], list[str], int, list[np.ndarray], list[str]]:
    """What the worker sends back for EDGE: the handout's format, or a variant (the scale
    stored for all-zero vectors, another clamp, another restored dtype)."""
    arrays, dtypes, restored = [], [], []
    for x in EDGE:
        q, scale = expected_int8(x)
        if clamp != (-127, 127):
            x32 = x.astype(np.float32)
            q = np.clip(np.round(x32 / scale.astype(np.float32)), *clamp).astype(np.int8)
        if zero_scale is not None:
            scale = np.where(np.abs(x).max(axis=-1, keepdims=True) == 0, zero_scale, scale)
            scale = scale.astype(np.float16)
        arrays += [q, scale]
        dtypes += ["int8", "float16"]
        restored.append((q.astype(np.float32) * scale.astype(np.float32)).astype(dtype))
    total = sum(a.nbytes for a in arrays)
    return arrays, dtypes, total, restored, [dtype] * len(restored)


def test_the_made_up_cache_is_exact_in_float16_with_zero_vectors_and_both_extremes() -> None:
    for x in EDGE:
        absmax = np.abs(x.astype(np.float32)).max(axis=-1)
        assert (absmax == 0).sum() >= 2
        q, _ = expected_int8(x)
        assert (q == 127).sum() >= 4 and (q == -127).sum() >= 4
        assert (np.abs(q) == 127).mean() >= 0.2  # far beyond same_int8's 5 % of slack


def test_the_round_trip_in_the_handouts_format_passes() -> None:
    v = judge_int8_cache(EDGE, *round_trip())
    assert v.passed, v.failures(0)
    assert v.max_error <= 0.25 / 127 + 1e-6  # quarter-off values, rounded


def test_any_positive_scale_for_all_zero_vectors_passes() -> None:
    """The handout stores 1; another guard (a tiny scale) undoes the zeros as well."""
    assert judge_int8_cache(EDGE, *round_trip(zero_scale=1e-3)).passed


@pytest.mark.parametrize("zero_scale", [0.0, float("nan")])
def test_an_unguarded_zero_scale_fails_and_says_why(zero_scale: float) -> None:
    v = judge_int8_cache(EDGE, *round_trip(zero_scale=zero_scale))
    assert not v.passed
    assert "0 / 0" in v.failures(0)[0]


def test_keys_and_values_restored_in_another_dtype_fail() -> None:
    v = judge_int8_cache(EDGE, *round_trip(dtype="float32"))
    assert not v.passed
    assert "float32 for a float16 cache" in v.failures(0)[0]


@pytest.mark.parametrize("clamp", [(-126, 127), (-127, 126)])
def test_a_clamp_one_level_short_fails_and_says_why(clamp: tuple[int, int]) -> None:
    v = judge_int8_cache(EDGE, *round_trip(clamp=clamp))
    assert not v.passed
    assert "must come out as ±127" in v.failures(0)[0]


def test_a_nan_round_trip_never_passes() -> None:
    arrays, dtypes, total, restored, restored_dtypes = round_trip()
    restored = [np.full_like(y, np.nan) for y in restored]
    v = judge_int8_cache(EDGE, arrays, dtypes, total, restored, restored_dtypes)
    assert math.isnan(v.max_error) and not v.passed
