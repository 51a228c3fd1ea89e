"""Combinations of Part 1's known mistakes: which are made, which are stored, and that the
committed cases hold them."""

from __future__ import annotations

import itertools
import json

from grader.core.paths import TEST_CASES
from grader.judging.base import same_value
from grader.parts.part1 import build
from grader.parts.part1.causes import parts_of
from grader.parts.part1.combine import MAX_PARTS, Combiner
from grader.ta.mutants import load_mutants
from tests.conftest import SOLUTION

HIDDEN = json.loads((TEST_CASES / "hidden" / "part1.json").read_text())
SINGLES = {m.name: m.edits for m in load_mutants("part1", combined=False)}
PARAM_MISTAKES = ["mha_projections", "no_output_head", "two_matrix_ffn", "no_norm_weights"]


def combiner() -> Combiner:
    return Combiner((SOLUTION / "question1.py").read_text(), SINGLES)


def test_edits_of_the_same_text_are_not_combined() -> None:
    """Two ways of writing one line cannot both be in a submission."""
    c = combiner()
    assert not c.compatible(["mha_kv_cache", "kv_missing_factor_2"])
    assert not c.compatible(["tp_weights_replicated", "tp_cache_not_split"])
    assert c.module(["mha_kv_cache", "kv_missing_factor_2"]) is None
    assert c.compatible(PARAM_MISTAKES)


def test_a_combination_is_the_reference_with_every_edit_applied() -> None:
    module = combiner().module(PARAM_MISTAKES)
    spec = module.ModelSpec(**build.LLAMA3_8B)
    d, v, n, ff = 4096, 128256, 32, 14336
    assert module.param_count(spec) == v * d + n * (4 * d * d + 2 * d * ff) + d


def test_every_compatible_set_of_a_cases_mistakes_is_stored_unless_a_smaller_one_explains_it() -> (
    None
):
    """1.1's four parameter mistakes make 11 sets of 2 to 4; each gives a count of its
    own. 1.4's batch sizes floor away the norm weights: a set that adds them to another
    gives that set's value and is left out."""
    mistakes = HIDDEN["answers"]["1.1 LLaMA-3-8B"]["mistakes"]
    combined = [n for n in mistakes if len(parts_of(n)) > 1]
    sets = [s for k in range(2, MAX_PARTS + 1) for s in itertools.combinations(PARAM_MISTAKES, k)]
    assert len(combined) == len(sets) == 11
    assert {parts_of(n) for n in combined} == {frozenset(s) for s in sets}
    batch = HIDDEN["answers"]["1.4 LLaMA-3-8B, 80 GiB, context 1024"]["mistakes"]
    assert "mha_projections+no_norm_weights+no_output_head+two_matrix_ffn" not in batch
    assert "mha_projections+no_output_head+two_matrix_ffn" in batch


def test_no_stored_combination_repeats_the_value_of_a_smaller_set() -> None:
    answers = [*HIDDEN["answers"].values(), *HIDDEN["cases"]]
    for answer in answers:
        stored = answer["mistakes"]
        for name, value in stored.items():
            if isinstance(value, dict):
                continue
            smaller = [o for o in stored if parts_of(o) < parts_of(name)]
            assert not any(same_value(value, stored[o], 1e-6) for o in smaller), name
            assert not same_value(value, answer["expected"], 1e-6), name


def test_a_new_mistake_in_the_library_is_combined_with_no_code_of_its_own() -> None:
    """One more edit (an entry of the toml file) joins the combinations of every case it
    changes."""
    edit = ("spec.n_layers * per_layer", "(spec.n_layers - 1) * per_layer")
    c = Combiner((SOLUTION / "question1.py").read_text(), {**SINGLES, "one_layer_less": (edit,)})
    reference = c.module([])
    mutants = {n: c.module([n]) for n in ("one_layer_less", "no_output_head")}
    case = build.case("1.1", "LLaMA-3-8B", "param_count", build.spec(build.LLAMA3_8B))
    mistakes = build.finish(case, reference, mutants, c)["mistakes"]
    assert list(mistakes) == ["one_layer_less", "no_output_head", "no_output_head+one_layer_less"]
    both = c.module(["one_layer_less", "no_output_head"])
    assert mistakes["no_output_head+one_layer_less"] == build.call(both, case)
