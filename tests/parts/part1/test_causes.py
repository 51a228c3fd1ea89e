"""Naming Part 1's known mistakes: single, several at once, per table entry, and an
answer written in for the write-up's input."""

from __future__ import annotations

from grader.core.feedback_items import Feedback
from grader.parts.part1.causes import HARD_CODED, cover, minimal, name_causes
from grader.ta.mutants import load_mutants

DIAGNOSES = {m.name: m.diagnosis for m in load_mutants("part1", combined=False)}
PARAM_MISTAKES = ["mha_projections", "no_output_head", "two_matrix_ffn", "no_norm_weights"]


def ids(causes) -> list[str]:
    """The cause ids results.json keeps for the named ``causes``."""
    return Feedback(causes=causes).cause_ids()


def test_a_combination_names_every_part_and_notes_each_id() -> None:
    causes = name_causes(["no_output_head+two_matrix_ffn"], DIAGNOSES)
    want = f"{DIAGNOSES['no_output_head']}, and {DIAGNOSES['two_matrix_ffn']}"
    assert [c.text for c in causes] == [f"your code {want}"]
    assert ids(causes) == ["no_output_head", "two_matrix_ffn"]


def test_a_set_that_adds_a_mistake_to_another_explanation_is_not_named() -> None:
    assert minimal(["a", "a+b", "b+c", "a+b+c"]) == ["a", "b+c"]
    causes = name_causes(["no_output_head", "no_output_head+two_matrix_ffn"], DIAGNOSES)
    assert all(DIAGNOSES["two_matrix_ffn"] not in c.text for c in causes)
    assert ids(causes) == ["no_output_head"]


def test_a_combination_with_an_unknown_part_is_not_named() -> None:
    assert name_causes(["no_output_head+no_such_mistake"], DIAGNOSES) == []


def test_table_entries_are_covered_by_few_mistakes() -> None:
    """Each wrong entry's explanations; the entry with one explanation chooses first."""
    explained = {
        "total_params": ["no_output_head"],
        "max_batch_size": ["mha_kv_cache+two_matrix_ffn", "mha_kv_cache+no_output_head"],
        "kv_cache_per_request_gib": ["mha_kv_cache"],
    }
    assert cover(explained) == {"no_output_head", "mha_kv_cache"}


def test_four_parameter_mistakes_at_once_are_named_together(grade_patched) -> None:
    """K/V sized as MHA, no output head, a two-matrix FFN and no norm weights: 1.1 names
    all four in one sentence, results.json lists all four ids, and 1.12's hidden specs
    name them too."""
    mutants = {m.name: m for m in load_mutants("part1", combined=False)}
    graded = grade_patched(
        [e for name in PARAM_MISTAKES for e in mutants[name].edits],
        numbers=frozenset({"1.1", "1.12"}),
    )
    order = sorted(PARAM_MISTAKES)
    sentence = "Likely cause: your code " + ", and ".join(DIAGNOSES[n] for n in order) + "."
    assert graded.score("1.1") == 0
    assert "returned 6,430,920,704, which is wrong (compared exactly)." in graded.output("1.1")
    assert sentence.removesuffix(".") in graded.output("1.1")  # other cases name others
    assert graded.test("1.1")["extra_data"]["causes"] == order
    assert sentence.removesuffix(".") in graded.output("1.12")


def test_the_write_ups_answer_returned_for_another_input_is_named(grade_patched) -> None:
    body = "    return embedding + spec.n_layers * per_layer + final_norm + output_head"
    graded = grade_patched([(body, "    return 8030261248")], numbers=frozenset({"1.1", "1.12"}))
    hint = "returns the answer for LLaMA-3-8B for other inputs as well"
    assert graded.score("1.1") == 0
    assert "param_count(an input of its own) returned 8,030,261,248, which is wrong " in (
        graded.output("1.1")
    )
    assert hint in graded.output("1.1")
    assert HARD_CODED in graded.test("1.1")["extra_data"]["causes"]
    assert hint in graded.output("1.12")
