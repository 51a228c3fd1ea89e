"""Part 2's isolation of wrong logits: mistakes the mutant library does not hold, written as
different students would, are narrowed to the piece that computes them (the positions of a
cached call, the keys attention saw, its scale, the cache, the feed-forward block, the
layer's wiring, the head, the rows of a batch), and library mistakes graded where no known
cause is named get an isolated cause that agrees with them, never another.

The edits are checked below not to be in ``grader/ta/mutants/part2.toml``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from grader.parts.part2.cases import make_state_dict
from grader.parts.part2.pieces import Finding, cache_facts, first_departure, position_map
from grader.parts.part2.reference_np import Reference, trustworthy, visible
from grader.ta.mutants import load_mutants
from tests.conftest import ROOT, library_edits, one_kept_quick
from tests.parts.part2.test_checks import grade_edit

PUBLIC = json.loads((ROOT / "test_cases" / "public" / "part2.json").read_text())
COURSE = json.loads((ROOT / "test_cases" / "public" / "part2" / "test_cases.json").read_text())
MUTANTS = {m.name: m for m in load_mutants("part2", combined=False)}
DIAGNOSES = {m.name: m.diagnosis for m in MUTANTS.values() if m.diagnosis}

CAT = (
    "            k = torch.cat([past_kv[0], k], dim=1)  # (B, T_total, D)\n"
    "            v = torch.cat([past_kv[1], v], dim=1)  # (B, T_total, D)\n"
)
#: Unlisted mistakes: (edits, the check graded, the isolated cause, words the page must say).
MISTAKES = {
    # The cache's length read from the width: positions jump to d_model after the prefill.
    "t_past_from_width": (
        [("t_past = past_kv[0][0].shape[1] if", "t_past = past_kv[0][0].shape[2] if")],
        "2.4",
        "isolated:call_positions_wrong",
        ["at positions from 50, the model's d_model, where they follow 1 cached token",
         "layer 0's input is token_embedding + pos_embedding at position 50, not at position 1"],
    ),
    # Keys and values handed back in the wrong order.
    "cache_pair_swapped": (
        [("((k, v) if use_cache else None)", "((v, k) if use_cache else None)")],
        "2.4",
        "isolated:cache_contents_wrong",
        ["the cache your layer 0 hands back after 1 token does not hold",
         "its keys hold the values; its values hold the keys"],
    ),
    # The cache is extended and returned, but attention still uses the new keys only.
    "attends_before_concatenating": (
        [(CAT, "            k_all = torch.cat([past_kv[0], k], dim=1)\n"
               "            v_all = torch.cat([past_kv[1], v], dim=1)\n"
               "        else:\n            k_all, v_all = k, v\n"),
         ("((k, v) if use_cache else None)", "((k_all, v_all) if use_cache else None)")],
        "2.4",
        "isolated:attention_ignores_cache",
        ["attends only to the new tokens: the 1 cached keys and values are not read",
         "one token at a time: first departs at call 2 of 10"],
    ),
    # "With a cache only one token comes at a time, so no mask is needed."
    "mask_only_without_cache": (
        [('scores = scores.masked_fill(mask, float("-inf"))',
          'scores = scores.masked_fill(mask, float("-inf")) if past_kv is None else scores')],
        "2.5",
        "isolated:attention_sees_later_tokens",
        ["one token at a time: right", "matches attention with no mask",
         "call 2 of 3 (3 new tokens after 4 cached)"],
    ),
    # A ReLU after the second linear layer too.
    "relu_after_fc2": (
        [("return self.fc2(F.relu(self.fc1(x)))", "return F.relu(self.fc2(F.relu(self.fc1(x))))")],
        "2.2",
        "isolated:feed_forward_departs",
        ["layer 0's feed-forward block departs from fc2(relu(fc1(x)))"],
    ),
    # The residual added to the normalised input instead of the layer's input.
    "residual_from_normed": (
        [("attended, new_kv = self.attention(self.norm1(x), past_kv, use_cache)\n"
          "        x = x + self.dropout(attended)",
          "h = self.norm1(x)\n        attended, new_kv = self.attention(h, past_kv, use_cache)\n"
          "        x = h + self.dropout(attended)")],
        "2.2",
        "isolated:layer_wiring_departs",
        ["layer 0's attention and feed-forward block are right on their own inputs"],
    ),
    # The final norm forgotten.
    "no_final_norm": (
        [("logits = self.output_projection(self.norm(x))", "logits = self.output_projection(x)")],
        "2.2",
        "isolated:output_head_departs",
        ["every layer of your model is right, but the logits are not"],
    ),
    # The course's width typed in: right on the public model, wrong on the hidden one.
    "scale_typed_in": (
        [("/ math.sqrt(self.d_model)", "/ math.sqrt(50)")],
        "2.6",
        "isolated:attention_scale_wrong",
        ["divides the scores by 7.071 = sqrt(50), not by sqrt(d_model) = 8",
         "The same plans on the public model, of other sizes, are right."],
    ),
    # Heads merged back as if the context were (T, B, D): right for every single prompt.
    "batch_mixed_in_merge": (
        [("        context = weights @ v  # (B, T_new, D)\n",
          "        context = (weights @ v).transpose(0, 1).reshape(x.shape)\n")],
        "2.6",
        "isolated:batch_rows_differ",
        ["3 different prompts of 10 tokens in one batch, without the cache, each right alone"],
    ),
}  # fmt: skip


def test_the_mistakes_are_not_in_the_mutant_library() -> None:
    library = library_edits("part2", combined=False)
    for edits, *_ in MISTAKES.values():
        assert not set(edits) & library


@pytest.mark.parametrize("name", one_kept_quick(sorted(MISTAKES)))
def test_an_unlisted_mistake_is_narrowed_to_its_piece(tmp_path: Path, name: str) -> None:
    edits, check, cause, words = MISTAKES[name]
    graded = grade_edit(tmp_path, edits, {check})
    message = graded.output(check)
    assert graded.test(check)["status"] == "failed", message
    assert graded.test(check)["extra_data"]["causes"] == [cause], message
    for text in words:
        assert text in message, message
    assert not [d for d in DIAGNOSES.values() if d in message], message  # no known wording


# ----------------------------------------------- library mistakes: agreeing causes, or none


@pytest.mark.parametrize(
    ("mutant", "check", "cause", "words"),
    [
        # No known diagnosis in the hidden checks: the isolated cause must say the same.
        ("positions_not_offset", "2.7", "isolated:call_positions_wrong", "at positions from 0"),
        ("post_ln", "2.6", "isolated:attention_input_not_norm1", "given the layer's input"),
        ("scale_by_d_model", "2.6", "isolated:attention_scale_wrong", "by 64, not by sqrt"),
        ("cache_before_append", "2.7", "isolated:cache_contents_wrong", "(1, 1, 64) where"),
        ("gelu_feed_forward", "2.6", "isolated:feed_forward_departs", "fc2(relu(fc1(x)))"),
    ],
)
def test_a_library_mistake_gets_no_other_cause(
    tmp_path: Path, mutant: str, check: str, cause: str, words: str
) -> None:
    graded = grade_edit(tmp_path, list(MUTANTS[mutant].edits), {check})
    message = graded.output(check)
    assert graded.test(check)["extra_data"]["causes"] == [cause], message
    assert words in message, message


def test_a_known_mistake_keeps_its_words_alone(tmp_path: Path) -> None:
    """Where the catalogue names the mistake, no experiment runs and nothing is added."""
    graded = grade_edit(tmp_path, list(MUTANTS["mask_not_offset"].edits), {"2.5"})
    message = graded.output("2.5")
    assert graded.test("2.5")["extra_data"]["causes"] == ["mask_not_offset"]
    assert "Narrowed by experiment" not in message


def test_a_right_submission_runs_no_experiment(solution_graded) -> None:
    for test in solution_graded.part_tests("part2"):
        assert "Narrowed by experiment" not in test.get("output", "")
        assert not test.get("extra_data", {}).get("causes")


# --------------------------------------------------------------- the pieces, unit by unit


def reference() -> Reference:
    return Reference(make_state_dict(PUBLIC["models"]["public"]))


def test_the_numpy_reference_gives_the_stored_logits() -> None:
    ref = reference()
    assert trustworthy(ref, COURSE, PUBLIC["atol"])
    for case in COURSE:
        got = ref.logits(np.array(case["input_ids"]))
        assert np.abs(got - np.array(case["expected_logits_no_cache"])).max() < 1e-3
    broken = Reference({**ref.weights, "norm.bias": ref.weights["norm.bias"] + 0.5})
    assert not trustworthy(broken, COURSE, PUBLIC["atol"])


def test_views_of_a_cached_call() -> None:
    assert visible(2, 4, "causal").tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert visible(2, 4, "new_only").tolist() == [[0, 0, 1, 0], [0, 0, 1, 1]]
    assert visible(2, 4, "not_itself").tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    assert visible(1, 1, "not_itself").tolist() == [[1]]


def trace_of(ref: Reference, ids: np.ndarray, plan: list[int]) -> dict[str, np.ndarray]:
    """What a right model's trace holds for ``plan``, from the reference's own pieces."""
    trace, start, past = {}, 0, [None] * ref.layers
    for c, n in enumerate(plan):
        x = ref.embed(ids[:, start : start + n], start)
        for i in range(ref.layers):
            trace[f"c{c}.l{i}.layer.in"] = x
            normed = ref.norm(f"layers.{i}.norm1", x)
            a = ref.attention(i, normed, past[i])
            mid = x + a
            f_in = ref.norm(f"layers.{i}.norm2", mid)
            trace[f"c{c}.l{i}.attention.in"], trace[f"c{c}.l{i}.attention.out"] = normed, a
            f = ref.feed_forward(i, f_in)
            trace[f"c{c}.l{i}.feed_forward.in"], trace[f"c{c}.l{i}.feed_forward.out"] = f_in, f
            x = mid + f
            trace[f"c{c}.l{i}.layer.out"] = x
            past[i] = normed if past[i] is None else np.concatenate([past[i], normed], axis=1)
            trace[f"c{c}.k{i}"], trace[f"c{c}.v{i}"] = ref.keys_values(i, past[i])
        trace[f"c{c}.logits"] = ref.head(x)
        start += n
    return trace


def test_a_right_trace_departs_nowhere_and_a_changed_piece_is_found() -> None:
    ref = reference()
    ids = np.random.default_rng(1).integers(0, 1000, size=(1, 7))
    trace = trace_of(ref, ids, [4, 1, 2])
    assert first_departure(ref, trace, ids, [4, 1, 2], 1e-2) is None
    trace["c1.l1.feed_forward.out"] = trace["c1.l1.feed_forward.out"] + 0.5
    found = first_departure(ref, trace, ids, [4, 1, 2], 1e-2)
    assert found == Finding("feed_forward", 1, 1, pytest.approx(0.5), {})


def test_the_cache_facts_name_swaps_and_slots() -> None:
    ref = reference()
    inputs = np.random.default_rng(2).standard_normal((1, 3, 50))
    k, v = ref.keys_values(0, inputs)
    assert cache_facts(ref, 0, inputs, k, v, 1e-2) == {}
    swapped = cache_facts(ref, 0, inputs, v, k, 1e-2)
    assert swapped["keys"]["holds"] == "the values" and swapped["values"]["holds"] == "the keys"
    reversed_keys = cache_facts(ref, 0, inputs, k[:, ::-1], v, 1e-2)
    assert reversed_keys["keys"]["slots"] == [2, 1, 0] and "values" not in reversed_keys
    assert position_map(k[:, -1:], k, 1e-2) == [2]
