"""Part 3's isolating experiments: a cached generate that ignores kv_caching is not told
only that it never advances prev_pos, and one that keeps <|eot_id|> is not told that it
did not stop there; the mutant library's prev_pos_not_advanced is still named."""

from __future__ import annotations

from pathlib import Path

from grader.parts.part3.isolate import (
    KV_CACHING_IGNORED,
    PREV_POS_NOT_ADVANCED,
    START_POS_STUCK,
    STOP_TOKEN_KEPT,
    call_causes,
    kept_stop,
    ran_past_stop,
)
from grader.ta.mutants import load_mutants
from tests.parts.part3.test_checks import grade_numbers

GENERATION = "llama/generation.py"
DIAGNOSES = {PREV_POS_NOT_ADVANCED: "never advances prev_pos"}
EOT = "<|eot_id|>"


def test_the_whole_prefix_every_step_names_both_mistakes_that_make_it() -> None:
    calls = [[0, 9], [0, 10], [0, 11], [0, 12], [0, 13]]
    causes, line = call_causes(calls, list(calls), DIAGNOSES)
    assert [c.id for c in causes] == [KV_CACHING_IGNORED, PREV_POS_NOT_ADVANCED]
    assert "(0, 9), (0, 10), (0, 11), (0, 12), ..." in line
    assert "the same calls as with kv_caching=False" in line
    assert "kv_caching ignored" in line and "prev_pos is never advanced" in line


def test_one_token_at_a_start_pos_that_never_moves_is_prev_pos_alone() -> None:
    causes, line = call_causes([[0, 9], [9, 1], [9, 1], [9, 1]], [], DIAGNOSES)
    assert [c.id for c in causes] == [START_POS_STUCK]
    assert "always at start_pos=9" in line
    assert "start_pos=9" in causes[0].text


def test_other_call_patterns_single_out_nothing() -> None:
    for calls in ([[0, 9], [9, 2], [11, 2]], [[0, 9], [9, 1], [10, 1]], [[0, 9]], []):
        assert call_causes(calls, [], DIAGNOSES) == ([], "")


def test_the_text_against_the_reference_tells_kept_from_ran_on() -> None:
    want = ["Hello there", "more"]
    kept = [f"Hello there{EOT}", "more"]
    ran_on = [f"Hello there{EOT} and so on", "more"]
    assert (kept_stop(kept, want, EOT), ran_past_stop(kept, want, EOT)) == ([1], [])
    assert (kept_stop(ran_on, want, EOT), ran_past_stop(ran_on, want, EOT)) == ([], [1])
    assert kept_stop(want, want, EOT) == ran_past_stop(want, want, EOT) == []


def test_a_generate_ignoring_kv_caching_is_told_so(tmp_path: Path) -> None:
    same_call = (
        "                logits = self(tokens[:, prev_pos:cur_pos], prev_pos)  # new tokens only\n",
        "                logits = self(tokens[:, :cur_pos], 0)  # one call for both modes\n",
    )
    graded = grade_numbers(tmp_path, GENERATION, [same_call], {"3.7"})
    message = graded.output("3.7")
    assert graded.score("3.7") == 0
    assert "your code ignores kv_caching" in message, message
    assert "the same calls as with kv_caching=False" in message
    assert KV_CACHING_IGNORED in graded.test("3.7")["extra_data"]["causes"]


def test_prev_pos_not_advanced_is_still_named(tmp_path: Path) -> None:
    [mutant] = [m for m in load_mutants("part3") if m.name == PREV_POS_NOT_ADVANCED]
    graded = grade_numbers(tmp_path, mutant.file, list(mutant.edits), {"3.7"})
    message = graded.output("3.7")
    assert graded.score("3.7") == 0
    assert mutant.diagnosis in message, message
    assert PREV_POS_NOT_ADVANCED in graded.test("3.7")["extra_data"]["causes"]


def test_a_stop_token_kept_in_the_text_is_not_a_run_on(tmp_path: Path) -> None:
    kept = (
        "generated = generated[: generated.index(s)]",
        "generated = generated[: generated.index(s) + 1]",
    )
    graded = grade_numbers(tmp_path, GENERATION, [kept], {"3.5"})
    message = graded.output("3.5")
    assert graded.score("3.5") == 0
    assert "stopped at <|eot_id|> but kept it in the output" in message, message
    assert "did not stop at" not in message
    causes = graded.test("3.5")["extra_data"]["causes"]
    assert STOP_TOKEN_KEPT in causes and "no_eot_stop" not in causes
