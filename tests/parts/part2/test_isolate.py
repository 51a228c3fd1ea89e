"""Check 2.10's isolating experiment: a forward wrong only for a batch is not blamed on the
sampler, and a sampler that is wrong still is."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grader.parts.part2.isolate import BATCH_ROWS_DIFFER, PREFILL_DIFFERS, Departure, departure
from tests.parts.part2.test_checks import grade_edit

SAMPLER = "sample must draw from softmax(logits / temperature)"


def test_rows_within_the_tolerance_do_not_depart() -> None:
    alone = np.array([1.0, 2.0, 3.0])
    batch = np.stack([alone, alone + 1e-6, alone - 1e-6])
    assert departure(alone, batch, 1e-4) is None


def test_the_first_departing_row_is_counted_from_1_with_the_largest_difference() -> None:
    alone = np.zeros(4)
    batch = np.zeros((5, 4))
    batch[2, 1], batch[4, 3] = 0.5, -2.0
    assert departure(alone, batch, 1e-4) == Departure(3, 5, 2.0)


def test_nan_and_wrong_shapes_always_depart() -> None:
    alone = np.zeros(3)
    off = departure(alone, np.array([[0.0, 0.0, 0.0], [np.nan, 0.0, 0.0]]), 1e-4)
    assert off is not None and off.row == 2
    assert departure(alone, np.zeros((2, 4)), 1e-4) is not None


def test_attention_wrong_only_for_a_batch_is_not_blamed_on_the_sampler(tmp_path: Path) -> None:
    """Heads merged back as if the context were (T, B, D): the same memory order when B is
    1, so every single prompt is right, but the 1,024 copies 2.10 draws from are scrambled."""
    merge = (
        "        context = weights @ v  # (B, T_new, D)\n",
        "        context = (weights @ v).transpose(0, 1).reshape(x.shape)\n",
    )
    graded = grade_edit(tmp_path, [merge], {"2.10"})
    message = graded.output("2.10")
    assert graded.score("2.10") == 0
    assert "forward gives other logits for a prompt in a batch than for the prompt alone" in (
        message
    ), message
    assert "copies of the prompt, the batch generate drew from" in message
    assert "first at row 1 of 1024" in message
    assert SAMPLER not in message
    assert graded.test("2.10")["extra_data"]["causes"] == [BATCH_ROWS_DIFFER]


def test_a_wrong_sampler_is_still_named_after_the_batch_agrees(tmp_path: Path) -> None:
    floor = ("softmax(logits / temperature, dim=-1)", "softmax(logits // temperature, dim=-1)")
    graded = grade_edit(tmp_path, [floor], {"2.10"})
    message = graded.output("2.10")
    assert graded.score("2.10") == 0
    assert SAMPLER in message
    assert "in a batch than for the prompt alone" not in message
    # sample alone, the temperature varied alone: its draws fit no softmax(logits / T').
    causes = graded.test("2.10").get("extra_data", {}).get("causes", [])
    assert causes == ["isolated:sampler_temperature_departs"], message
    assert "no softmax(logits / T') of the logits fits" in message


def test_a_cached_prefill_that_differs_is_named_not_the_sampler(tmp_path: Path) -> None:
    """The causal mask left out with the cache on: the prompt alone already gets other
    logits from its cached prefill, so the batch is not blamed either."""
    unmasked = (
        'scores = scores.masked_fill(mask, float("-inf"))',
        'scores = scores if use_cache else scores.masked_fill(mask, float("-inf"))',
    )
    graded = grade_edit(tmp_path, [unmasked], {"2.10"})
    message = graded.output("2.10")
    assert graded.score("2.10") == 0
    assert "gives a prompt fed in one call other logits than without the cache" in message, message
    assert SAMPLER not in message
    assert "in a batch than for the prompt alone" not in message
    assert graded.test("2.10")["extra_data"]["causes"] == [PREFILL_DIFFERS]
