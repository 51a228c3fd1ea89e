"""Part 3's forward isolation (grader/parts/part3/isolate_forward.py, pieces.py, wording.py):
mistakes the mutant library does not hold, each graded, its feedback naming the narrowed
place and no other cause; the grader's own model against the stored cases; a piece judged
on its own input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grader.core.arrays import decode_array
from grader.parts.part3.pieces import first_departure
from grader.parts.part3.reference import ReferenceLlama, ReferenceUnavailable
from grader.runtime.context import load_cases
from grader.ta.mutants import load_mutants
from tests.conftest import one_kept_quick
from tests.parts.part3.test_checks import grade_numbers

MODEL = "llama/model.py"

#: Mistakes as different students write them (none in the mutant library), the check that
#: loses points to each, the one cause its feedback must name and words of its place.
MISTAKES = {
    # The prefix columns of the mask put after the causal block instead of before it.
    "mask_columns_after": (
        "return torch.hstack([history, mask])  # (T, start_pos + T)",
        "return torch.hstack([mask, history])",
        "3.3", "isolated:chunk_mask_wrong", "the cache holds the chunk's keys and values",
    ),
    # Copy and paste: the values' cache written with the keys.
    "values_cached_as_keys": (
        "self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv",
        "self.cache_v[:bsz, start_pos : start_pos + seqlen] = xk",
        "3.3", "isolated:cached_call_departs", "layer 0's attention",
    ),
    # transpose(0, 2) for transpose(1, 2): right for one row, rows mixed in a batch.
    "heads_transposed_with_rows": (
        "output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)",
        "output = output.transpose(0, 2).reshape(bsz, seqlen, -1)",
        "3.2", "isolated:batch_rows_differ", "row 1 of 3",
    ),
    # The softmax over the queries instead of the keys.
    "softmax_over_queries": (
        "scores = F.softmax(scores.float(), dim=-1).type_as(xq)",
        "scores = F.softmax(scores.float(), dim=-2).type_as(xq)",
        "3.2", "isolated:forward_departs_without_cache", "layer 0's attention",
    ),
    # Each decode step's key written one position late.
    "decode_written_one_late": (
        "self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk",
        "at = start_pos + (seqlen == 1)\n"
        "            self.cache_k[:bsz, at : at + seqlen] = xk",
        "3.3", "isolated:decode_steps_depart", "the prefill is right and the first decode step",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", one_kept_quick(sorted(MISTAKES)))
def test_a_forward_mistake_nobody_listed_is_narrowed_to_its_place(
    tmp_path: Path, name: str
) -> None:
    old, new, number, cause, place = MISTAKES[name]
    graded = grade_numbers(tmp_path, MODEL, [(old, new)], {number})
    message = graded.output(number)
    assert graded.score(number) < 4, message
    assert graded.test(number)["extra_data"]["causes"] == [cause], message  # nothing else
    assert place in message, message
    assert "Narrowed by experiment" in message or cause == "isolated:batch_rows_differ"


def test_a_known_mistake_keeps_its_words_and_gets_no_isolated_cause(tmp_path: Path) -> None:
    [mutant] = [m for m in load_mutants("part3") if m.name == "rope_from_zero"]
    graded = grade_numbers(tmp_path, mutant.file, list(mutant.edits), {"3.3"})
    assert mutant.diagnosis in graded.output("3.3")
    causes = graded.test("3.3")["extra_data"]["causes"]
    assert "rope_from_zero" in causes and not [c for c in causes if c.startswith("isolated:")]


@pytest.fixture(scope="module")
def cases() -> dict:
    return load_cases("part3")


def test_the_graders_model_gives_the_stored_logits_in_both_conventions(cases) -> None:
    for model in ("public", "hidden"):
        case = next(c for c in cases["cases"] if c["model"] == model)
        for scaled, key in ((True, "expected"), (False, "expected_unscaled")):
            ref = ReferenceLlama.of(cases["models"][model], scaled)
            got = ref.logits(np.array(case["tokens"]))[:, case["positions"]]
            assert np.abs(got - decode_array(case[key])).max() < cases["atol"], case["label"]
    spec = {**cases["models"]["public"], "seed": 1}  # weights not the stored ones
    with pytest.raises(ReferenceUnavailable):
        ReferenceLlama.of(spec)


def recorded(ref: ReferenceLlama, ids: np.ndarray) -> dict[str, np.ndarray]:
    """What the worker records of a right model, from the reference's own stages."""
    st = ref.stages(ids)
    arrays = {"out.embeddings": st["embeddings"], "logits": st["logits"]}
    h = st["embeddings"]
    for i in range(ref.n_layers):
        arrays[f"in.attention.{i}"] = ref.norm_on(h, f"layers.{i}.attention_norm")
        arrays[f"out.attention.{i}"] = st[f"attention.{i}"]
        arrays[f"in.feed_forward.{i}"] = ref.norm_on(
            h + st[f"attention.{i}"], f"layers.{i}.ffn_norm"
        )
        arrays[f"out.feed_forward.{i}"] = st[f"feed_forward.{i}"]
        arrays[f"out.layer.{i}"] = h = st[f"layer.{i}"]
    return arrays


def test_a_piece_is_judged_on_its_own_input_so_only_the_wrong_one_departs(cases) -> None:
    ref = ReferenceLlama.of(cases["models"]["public"])
    ids = np.random.default_rng(3).integers(0, 4096, size=(1, 9))
    arrays = recorded(ref, ids)
    assert first_departure(ref, arrays, ids, 1e-4) is None
    wrong = dict(arrays)
    wrong["out.feed_forward.1"] = arrays["out.feed_forward.1"].copy()
    wrong["out.feed_forward.1"][:, 5:] *= 1.5  # layer 1's feed-forward, from position 5
    found = first_departure(ref, wrong, ids, 1e-4)
    assert (found.piece, found.layer, found.position) == ("feed_forward", 1, 5)
    # Its consequence downstream (the layer's output) is not blamed: it sums right.
    wrong["out.layer.1"] = arrays["out.layer.1"] + (
        wrong["out.feed_forward.1"] - arrays["out.feed_forward.1"]
    )
    assert first_departure(ref, wrong, ids, 1e-4).piece == "feed_forward"
