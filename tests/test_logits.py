"""Comparing logits and naming known mistakes from their signatures."""

from __future__ import annotations

import numpy as np

from grader.cases_part2 import chunk_plan, decode_array, encode_array, fingerprint
from grader.checks.logits import compare, logits_problem, matching_mistakes


def logits(seed: int = 0, shape: tuple[int, int, int] = (2, 5, 12)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_compare_reports_the_first_wrong_position() -> None:
    want = logits()
    got = want.copy()
    assert compare(got, want, 1e-2).ok
    got[1, 3, 7] += 0.5
    result = compare(got, want, 1e-2)
    assert not result.ok
    assert result.first_bad == 3
    assert abs(result.max_error - 0.5) < 1e-6
    got[1, 3, 7] = want[1, 3, 7] + 0.009
    assert compare(got, want, 1e-2).ok


def test_logits_problem_catches_type_shape_and_nan() -> None:
    good = logits()
    assert logits_problem(good, (2, 5, 12)) == ""
    assert "3 dimensions" in logits_problem(good[0], (2, 5, 12))
    assert "expected (2, 5, 12)" in logits_problem(good[:, -1:, :], (2, 5, 12))
    assert "tensor of logits" in logits_problem(None, (2, 5, 12))
    bad = good.copy()
    bad[0, 2, 0] = np.nan
    assert "position 2" in logits_problem(bad, (2, 5, 12))


def test_mistakes_are_matched_by_logits_error_or_nondeterminism() -> None:
    a, b = logits(1), logits(2)
    catalogue = {
        "mistake_a": {"logits": fingerprint(a)},
        "mistake_b": {"logits": fingerprint(b)},
        "crash": {"error": "RuntimeError: shapes differ"},
        "random": {"nondeterministic": True},
    }
    assert matching_mistakes({"logits": a + 0.001}, catalogue, None) == ["mistake_a"]
    assert matching_mistakes({"logits": a + 0.1}, catalogue, None) == []
    assert matching_mistakes({"error": "RuntimeError: shapes differ"}, catalogue, None) == ["crash"]
    assert matching_mistakes({"error": "RuntimeError: other"}, catalogue, None) == []
    assert matching_mistakes({"logits": logits(3)}, catalogue, True) == ["random"]
    assert matching_mistakes({"logits": logits(3)}, catalogue, False) == []


def test_nan_positions_are_part_of_a_fingerprint() -> None:
    a = logits()
    a[0, 0, :] = np.nan
    catalogue = {"nan_first_row": {"logits": fingerprint(a)}}
    assert matching_mistakes({"logits": a.copy()}, catalogue, None) == ["nan_first_row"]
    assert matching_mistakes({"logits": logits()}, catalogue, None) == []


def test_array_codec_round_trips_exactly() -> None:
    a = logits(4)
    assert np.array_equal(decode_array(encode_array(a)), a)


def test_chunk_plans_cover_the_sequence() -> None:
    assert chunk_plan(8) == [4, 3, 1]
    assert chunk_plan(320, 100, 7)[:3] == [100, 7, 7]
    for n in range(1, 40):
        assert sum(chunk_plan(n)) == n


def test_error_kinds_match_across_python_wordings() -> None:
    from grader.checks.logits import same_error_kind

    py311 = "UnboundLocalError: cannot access local variable 'keys' where it is not associated"
    py310 = "UnboundLocalError: local variable 'keys' referenced before assignment"
    assert same_error_kind(py310, py311)
    assert not same_error_kind("UnboundLocalError: local variable 'values' referenced", py311)
    assert not same_error_kind("NameError: name 'keys' is not defined", py311)
    sized = "RuntimeError: The size of tensor a (17) must match the size of tensor b (7)"
    assert same_error_kind(sized, sized)
    assert not same_error_kind(sized.replace("(7)", "(9)"), sized)
    assert not same_error_kind("", sized)
