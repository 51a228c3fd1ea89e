"""grader/parts/part3/course.py: the RoPE convention of a submission, the case data it is
judged by, and the course template's mistakes named from what the worker saw."""

from __future__ import annotations

import numpy as np
import pytest

from grader.core.arrays import decode_array
from grader.parts.part3.course import (
    SCALED,
    UNSCALED,
    build_notes,
    expected_logits,
    generation_causes,
    rope_convention,
    rope_view,
)
from grader.runtime.context import load_cases

BOS = 4096
META = {"bos_id": BOS}


@pytest.fixture(scope="module")
def cases() -> dict:
    return load_cases("part3")


def full_logits(case: dict, rope: str) -> np.ndarray:
    """Logits of the case's whole shape that hold the ``rope`` reference at its positions."""
    tokens = np.array(case["tokens"])
    want = expected_logits(case, rope)
    got = np.zeros((*tokens.shape, want.shape[-1]), np.float32)
    got[:, case["positions"], :] = want
    return got


def test_every_forward_case_holds_both_conventions_and_they_differ(cases: dict) -> None:
    for case in cases["cases"]:
        scaled, plain = decode_array(case["expected"]), decode_array(case["expected_unscaled"])
        assert scaled.shape == plain.shape
        # Position 0 has no rotation, so the conventions agree only there.
        assert np.abs(scaled - plain).max() > 10 * cases["atol"], case["label"]


@pytest.mark.parametrize("rope", [SCALED, UNSCALED])
def test_the_convention_is_the_one_the_logits_match(cases: dict, rope: str) -> None:
    case = next(c for c in cases["cases"] if c["check"] == "3.2")
    assert rope_convention(full_logits(case, rope), case, cases["atol"]) == rope


def test_logits_of_neither_convention_or_no_logits_give_none(cases: dict) -> None:
    case = next(c for c in cases["cases"] if c["check"] == "3.2")
    assert rope_convention(full_logits(case, SCALED) + 0.01, case, cases["atol"]) is None
    assert rope_convention(np.full_like(full_logits(case, SCALED), np.nan), case, 1.0) is None
    assert rope_convention(None, case, cases["atol"]) is None


def test_the_unscaled_view_replaces_every_convention_value_public_and_hidden(cases: dict) -> None:
    view = rope_view(cases, UNSCALED)
    for key in ("expected_texts", "stop_generate", "sampling", "signatures"):
        assert view[key] == cases["unscaled_rope"][key]
    for key in ("hidden_generate", "bench_pools"):
        assert view[key] == cases["unscaled_rope_hidden"][key]
    assert view["bench_pools"] != cases["bench_pools"]
    assert rope_view(cases, SCALED) is cases


def test_both_stop_batches_of_both_conventions_end_at_eot(cases: dict) -> None:
    # The first prompt's greedy continuation reaches <|eot_id|>: the reference cuts it
    # there, so its text is shorter than max_gen_len tokens would give.
    for data in (cases, cases["unscaled_rope"]):
        stop = data["stop_generate"]
        assert len(stop["expected_texts"][0]) < len(stop["expected_texts"][1])
    for data in (cases, cases["unscaled_rope_hidden"]):
        assert data["hidden_generate"]["stop"]["prompts"]


def header(first: list[int], calls: list[list[int]]) -> dict:
    return {"first_ids": first, "calls": calls}


def test_bos_is_named_only_when_no_row_starts_with_bos() -> None:
    causes = generation_causes(header([40, 41], [[0, 5]]), ["a"], ["b"], META, 128)
    assert list(causes) == ["bos_missing"]
    assert "without BOS" in causes["bos_missing"] and "40" in causes["bos_missing"]
    assert generation_causes(header([BOS, BOS], [[0, 5]]), ["a"], ["b"], META, 128) == {}
    assert generation_causes(header([], []), ["a"], ["b"], META, 128) == {}


def test_a_left_padded_batch_is_named_not_a_missing_bos() -> None:
    """The shorter prompts of a left-padded batch start with the pad (0), the longest
    with BOS: the 0 is a pad, not a prompt encoded without BOS."""
    causes = generation_causes(header([0, BOS, 0], [[0, 5]]), ["a"], ["b"], META, 128)
    assert list(causes) == ["left_padded"]
    assert "left-padded" in causes["left_padded"] and "row(s) [1, 3]" in causes["left_padded"]
    assert "without BOS" not in causes["left_padded"]
    # Two other first ids beside BOS: neither explanation fits, so none is named.
    assert generation_causes(header([0, 7, BOS], [[0, 5]]), ["a"], ["b"], META, 128) == {}


def test_positions_past_max_seq_len_are_named() -> None:
    calls = [[0, 120], *([p, 1] for p in range(120, 143))]
    causes = generation_causes(header([BOS], calls), ["a"], ["b"], META, 128)
    assert list(causes) == ["past_max_seq_len"]
    assert "positions up to 143, past max_seq_len = 128" in causes["past_max_seq_len"]
    assert generation_causes(header([BOS], calls[:9]), ["a"], ["b"], META, 128) == {}


def test_a_text_that_runs_on_past_eot_is_named() -> None:
    want = ["Hello there", "more"]
    got = ["Hello there<|eot_id|> and so on", "more"]
    causes = generation_causes(header([BOS], [[0, 3]]), got, want, META, 128)
    assert list(causes) == ["no_eot_stop"]
    assert "did not stop at <|eot_id|> (prompt(s) [1]" in causes["no_eot_stop"]
    other = ["Hello where", "more"]
    assert generation_causes(header([BOS], [[0, 3]]), other, want, META, 128) == {}


def test_build_notes_say_only_what_happened() -> None:
    assert build_notes({}, SCALED, "cpu") == []
    kit = {"built_by": "build", "cuda_calls": 0, "switch": True}
    assert build_notes(kit, SCALED, "cpu") == []
    course = {"built_by": "constructor", "cuda_calls": 4, "switch": False,
              "dropped_fields": ["use_scaled_rope"]}  # fmt: skip
    text = "\n".join(build_notes(course, UNSCALED, "cpu"))
    for said in ("no build()", "['use_scaled_rope']", "(4) placed their tensors on cpu",
                 "no Llama 3.2 frequency scaling", "no set_kv_caching"):  # fmt: skip
        assert said in text
