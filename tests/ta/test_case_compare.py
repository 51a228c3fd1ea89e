"""Test cases are compared by meaning: last-bit float noise is not drift, real changes are."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from grader.core.arrays import encode_array
from grader.ta.case_compare import (
    ARRAYS,
    ROUNDED_JSON,
    Tolerance,
    compare_checkpoints,
    compare_files,
    compare_json,
)


def test_rounding_the_other_way_is_not_a_change() -> None:
    # The figures seen on two CPUs for the same fingerprint.
    seen_here, seen_there = {"logits": [[1.9262, 5.3999]]}, {"logits": [[1.9261, 5.3998]]}
    assert compare_json(seen_here, seen_there, ROUNDED_JSON) is None


def test_a_real_change_of_a_float_is_reported_with_its_place() -> None:
    problem = compare_json({"a": [1.0, 2.02]}, {"a": [1.0, 2.0]}, ROUNDED_JSON)
    assert problem is not None and "$.a[1]" in problem


@pytest.mark.parametrize(
    ("got", "want"),
    [
        (3, 4),  # a token id
        ("x", "y"),
        (True, False),
        (1, True),  # bool is not an int here
        ([1, 2], [1, 2, 3]),  # a length
        ({"a": 1}, {"a": 1, "b": 2}),  # a key
        (None, 0.0),
        (float("nan"), 1.0),  # NaN never equals a number
    ],
)
def test_exact_values_and_structure_must_match(got: object, want: object) -> None:
    assert compare_json(got, want, ROUNDED_JSON) is not None


def test_nan_matches_only_nan() -> None:
    tol = Tolerance(atol=1.0, rtol=1.0)
    assert tol.close(math.nan, math.nan)
    assert not tol.close(math.nan, 0.0) and not tol.close(0.0, math.nan)
    assert not tol.close(math.inf, 1e300) and tol.close(-math.inf, -math.inf)


def test_float32_arrays_allow_only_float_noise() -> None:
    rng = np.random.default_rng(0)
    want = rng.standard_normal((2, 3, 5)).astype(np.float32)
    noisy = want * np.float32(1 + 1e-6)
    assert compare_json(encode_array(noisy), encode_array(want), ROUNDED_JSON) is None
    changed = want.copy()
    changed[1, 2, 3] += 1e-3
    problem = compare_json(encode_array(changed), encode_array(want), ROUNDED_JSON)
    assert problem is not None and "element 28" in problem
    reshaped = compare_json(encode_array(want.reshape(6, 5)), encode_array(want), ROUNDED_JSON)
    assert reshaped is not None and "shape" in reshaped


def _saved(tensors: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(tensors, buf)
    return buf.getvalue()


def test_checkpoints_are_compared_tensor_by_tensor() -> None:
    torch.manual_seed(0)
    want = {"w": torch.randn(4, 4), "b": torch.randn(4)}
    noisy = {k: v * (1 + 1e-6) for k, v in want.items()}
    assert compare_checkpoints(_saved(noisy), _saved(want)) is None
    assert "gone ['b']" in (compare_checkpoints(_saved({"w": want["w"]}), _saved(want)) or "")
    assert compare_checkpoints(_saved({**want, "w": want["w"] * 1.01}), _saved(want)) is not None
    half = compare_checkpoints(_saved({**want, "w": want["w"].half()}), _saved(want))
    assert half is not None and "dtype" in half


def test_files_other_than_json_and_checkpoints_compare_by_bytes() -> None:
    assert compare_files("x/tokenizer.model", b"a 0\n", b"a 0\n") is None
    assert compare_files("x/tokenizer.model", b"a 0\n", b"a 1\n") == "bytes differ"


def test_part1_is_exact_arithmetic() -> None:
    want = json.dumps({"ai": [0.5, 1234.5678]}).encode()
    nudged = json.dumps({"ai": [0.5, 1234.5678 * (1 + 1e-7)]}).encode()
    assert compare_files("public/part1.json", nudged, want) is not None
    assert compare_files("public/part2.json", nudged, want) is None


def test_tolerances_stay_far_below_the_checks() -> None:
    from grader.parts.part2.cases import ATOL as PART2_ATOL
    from grader.parts.part3.cases import ATOL as PART3_ATOL

    assert ROUNDED_JSON.atol * 10 <= PART2_ATOL
    assert ARRAYS.atol * 10 <= min(PART2_ATOL, PART3_ATOL)
