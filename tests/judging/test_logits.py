"""Comparing logits and naming known mistakes from their signatures."""

from __future__ import annotations

import numpy as np

from grader.core.arrays import decode_array, encode_array, fingerprint
from grader.judging.logits import compare, logits_problem, matching_mistakes
from grader.parts.part2.cases import chunk_plan


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
    assert "batch row 1 of 2, position 3 of 5" in logits_problem(bad, (2, 5, 12))  # counted from 1


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
    from grader.judging.logits import same_error_kind

    py311 = "UnboundLocalError: cannot access local variable 'keys' where it is not associated"
    py310 = "UnboundLocalError: local variable 'keys' referenced before assignment"
    assert same_error_kind(py310, py311)
    assert not same_error_kind("UnboundLocalError: local variable 'values' referenced", py311)
    assert not same_error_kind("NameError: name 'keys' is not defined", py311)
    sized = "RuntimeError: The size of tensor a (17) must match the size of tensor b (7)"
    assert same_error_kind(sized, sized)
    assert not same_error_kind(sized.replace("(7)", "(9)"), sized)
    assert not same_error_kind("", sized)


SHAPE_ERROR = "RuntimeError: The size of tensor a (7) must match the size of tensor b (4) at non-singleton dimension 3"  # noqa: E501


def test_an_error_signature_and_observed_logits_never_crash_the_naming() -> None:
    """Check 3.3's probe: the catalogue holds errors for some mistakes and logits for
    others, the submission gave logits. Naming must not raise (NumPy's "truth value of
    an array is ambiguous" once replaced the whole message) and finds the logits match."""
    from types import SimpleNamespace

    from grader.judging.logits import signature_matches
    from grader.parts.part3.support import Part3Base

    got = logits(5)
    catalogue = {
        "mask_not_offset": {"error": SHAPE_ERROR},
        "rope_from_zero": {"logits": fingerprint(got)},
        "other_logits": {"logits": fingerprint(logits(6))},
        "texts": ["a", "b"],
    }
    assert [n for n, s in catalogue.items() if signature_matches(s, got)] == ["rope_from_zero"]
    assert not signature_matches({"error": SHAPE_ERROR}, got)
    assert not signature_matches(["a", "b"], got)
    assert signature_matches({"error": SHAPE_ERROR}, {"error": SHAPE_ERROR})
    stub = SimpleNamespace(
        signatures=lambda probe: catalogue,
        meta=lambda: {"diagnoses": {"rope_from_zero": "rotates from 0"}},
    )
    named: list = []
    stub.name = named.extend
    assert Part3Base.name_mistakes(stub, "chunked", got) == ""  # the page shows it apart
    assert [(c.id, c.text) for c in named] == [("rope_from_zero", "your code rotates from 0")]
    broken = SimpleNamespace(signatures=lambda probe: 1 / 0, meta=dict, name=named.extend)
    assert Part3Base.name_mistakes(broken, "chunked", got) == ""
    assert len(named) == 1  # nothing more named, and nothing raised


def test_one_shared_error_does_not_name_a_mistake_that_leaves_another_probe_right() -> None:
    """Attention over the new keys only and a mask without the start_pos columns raise
    the same shape error in chunks; one token at a time only the first is wrong."""
    from grader.judging.logits import explain

    new_keys_only = logits(7)
    catalogue = {
        "cached": {"attends_new_keys_only": {"logits": fingerprint(new_keys_only)}},
        "chunked": {
            "mask_not_offset": {"error": SHAPE_ERROR},
            "attends_new_keys_only": {"error": SHAPE_ERROR},
        },
    }
    # Wrong one token at a time (logits of an unknown mistake) and the shape error in chunks.
    unknown = {"cached": logits(8), "chunked": {"error": SHAPE_ERROR}}
    assert explain(unknown, catalogue, set()) == ([], False)
    seen = {"cached": new_keys_only, "chunked": {"error": SHAPE_ERROR}}
    assert explain(seen, catalogue, set()) == (["attends_new_keys_only"], False)
    # Right one token at a time: only the mask explains it.
    assert explain({"chunked": {"error": SHAPE_ERROR}}, catalogue, {"cached"}) == (
        ["mask_not_offset"],
        False,
    )


def test_two_mistakes_at_once_are_both_named() -> None:
    """Positions and mask not offset: the plain probe matches neither mistake, while a
    probe where only one of them shows (no position embeddings, or no attention values)
    matches that one."""
    from grader.judging.logits import explain, several_causes

    positions, mask, both = logits(9), logits(10), logits(11)
    catalogue = {
        "sequential": {
            "positions_not_offset": {"logits": fingerprint(positions)},
            "mask_not_offset": {"logits": fingerprint(mask)},
            "no_causal_mask": {"logits": fingerprint(logits(12))},
        },
        "sequential@no_positions": {
            "mask_not_offset": {"logits": fingerprint(mask + 1)},
            "no_causal_mask": {"logits": fingerprint(logits(13))},
        },
        "sequential@no_attention": {"positions_not_offset": {"logits": fingerprint(positions + 1)}},
    }
    seen = {
        "sequential": both,
        "sequential@no_positions": mask + 1,
        "sequential@no_attention": positions + 1,
    }
    names, several = explain(seen, catalogue, set())
    assert (sorted(names), several) == (["mask_not_offset", "positions_not_offset"], True)
    causes = several_causes(names, {"mask_not_offset": "MASK", "positions_not_offset": "POS"})
    assert sorted(c.id for c in causes) == ["mask_not_offset", "positions_not_offset"]
    assert sorted(c.text for c in causes) == ["your code MASK", "your code POS"]
    assert several_causes(names[:1], {"mask_not_offset": "MASK"}) == []  # one is not several
    # One mistake alone is named alone; logits equal to one mistake's rule out a blend.
    alone = {"sequential": mask, "sequential@no_positions": mask + 1}
    assert explain(alone, catalogue, {"sequential@no_attention"}) == (["mask_not_offset"], False)
    blended = {**seen, "sequential": positions}
    assert explain(blended, catalogue, set()) == ([], False)


def test_part2_naming_never_replaces_the_message() -> None:
    """Whatever goes wrong while naming (here: the rerun of a nondeterminism probe gives
    logits of another shape, which np.allclose refuses), the hint is empty."""
    from types import SimpleNamespace

    from grader.parts.part2.support import Part2Base

    def forward(*args, **kwargs):
        return logits(0, (1, 3, 12)), []

    stub = SimpleNamespace(
        signatures=lambda mode: {"dropout": {"nondeterministic": True}},
        course_cases=lambda: [{"input_ids": np.zeros((1, 5), dtype=np.int64)}],
        forward=forward,
        meta=lambda: {"diagnoses": {"dropout": "applies dropout"}},
    )
    stub.name_observed = lambda *a: Part2Base.name_observed(stub, *a)
    assert Part2Base.diagnose(stub, "no_cache", None, {"logits": logits()}) == []
