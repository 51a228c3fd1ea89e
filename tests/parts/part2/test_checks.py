"""End-to-end grading of Part 2: the solution, the blank skeleton, broken submissions,
and the promise that the skeleton's harness gives the autograder's public verdicts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grader.core.points import POINTS, part_total
from grader.core.thresholds import load_thresholds
from grader.parts.part2.cases import frequency_band, softmax64
from grader.runtime.timing import MIN_ROUNDS
from grader.ta.mutants import load_mutants
from tests.conftest import PART2_LIMITS, ROOT, SOLUTION, patched_solution, run_grade

CHECKS = set(POINTS["part2"])
FILE = "transformer_skeleton.py"
PUBLIC_DATA = ROOT / "test_cases" / "public" / "part2"


def test_solution_gets_full_marks(solution_graded) -> None:
    tests = solution_graded.part_tests("part2")
    assert {t["number"] for t in tests} == CHECKS
    assert [t["number"] for t in tests if t["status"] != "passed"] == []
    assert solution_graded.part_score("part2") == part_total("part2") == 30


def test_benchmark_check_is_tagged_and_reports_its_figures(solution_graded) -> None:
    bench = solution_graded.test("2.11")
    assert set(bench["tags"]) == {"part2", "benchmark"}
    assert "cpu profile" in bench["output"]
    record = solution_graded.data["extra_data"]["benchmarks"]["2.11"]
    assert record["profile"] == solution_graded.data["extra_data"]["benchmark_profile"] == "cpu"
    assert solution_graded.data["extra_data"]["benchmark_profile_provisional"] is False
    speedup, yardstick = record["criteria"]
    assert speedup["key"] == "part2.min_speedup" and speedup["passed"]
    assert speedup["ratio"]["low"] <= speedup["ratio"]["median"] <= speedup["ratio"]["high"]
    assert speedup["ratio"]["median"] >= 3
    assert f"speedup (cpu time): {speedup['ratio']['median']:.2f}x" in bench["output"]
    # The reference's cached path, timed in the same grading, is the yardstick.
    assert yardstick["key"] == "part2.max_vs_reference" and yardstick["passed"]
    assert (
        f"over the reference's (cpu time): {yardstick['ratio']['median']:.2f}x" in bench["output"]
    )
    assert set(record["timings"]) == {
        "with the cache",
        "without the cache",
        "the reference, with the cache",
    }
    # The reference clears every limit by a margin: decided after MIN_ROUNDS, within repeats.
    repeats = load_thresholds("cpu")["part2"]["repeats"]
    assert MIN_ROUNDS <= len(record["timings"]["with the cache"]["runs_s"]) <= repeats
    assert "benchmark" not in solution_graded.test("2.2")["tags"]


def test_blank_skeleton_scores_zero_with_a_clear_message(blank_graded) -> None:
    tests = blank_graded.part_tests("part2")
    assert {t["number"] for t in tests} == CHECKS
    assert blank_graded.part_score("part2") == 0
    assert "no parameter token_embedding.weight" in blank_graded.output("2.1")
    assert "see check 2.1" in blank_graded.output("2.4")


#: The timed benchmark (2.11) runs after every other check, so leaving it out changes no
#: other check's outcome: tests that read neither 2.11 nor the part's total skip it.
NO_BENCHMARK = frozenset({"benchmark"})


def grade_edit(
    tmp_path: Path, edits: list[tuple[str, str]], checks: set[str] | None = None, **kwargs
):
    """The solution with ``edits``, graded on Part 2 without the timed benchmark unless
    ``skip_tags=frozenset()`` asks for every check; only ``checks`` when given (what the
    test reads: a grading of every check costs several times more)."""
    submission = patched_solution(tmp_path / "submission", FILE, edits)
    kwargs.setdefault("limits", PART2_LIMITS)
    kwargs.setdefault("skip_tags", NO_BENCHMARK)
    if checks is not None:
        kwargs["numbers"] = frozenset(checks)
    return run_grade(submission, tmp_path / "out", parts=["part2"], **kwargs)


def test_a_w_o_bias_is_named_once_and_blocks_the_other_checks(tmp_path: Path) -> None:
    edit = (
        "self.W_o = nn.Linear(d_model, d_model, bias=False)",
        "self.W_o = nn.Linear(d_model, d_model)",
    )
    graded = grade_edit(tmp_path, [edit], skip_tags=frozenset())
    assert graded.part_score("part2") == 0
    message = graded.output("2.1")
    assert "layers.0.attention.W_o.bias, layers.1.attention.W_o.bias" in message
    assert "W_q, W_k, W_v and W_o have no bias" in message
    assert "see check 2.1" in graded.output("2.4")
    assert "W_o.bias" not in graded.output("2.4")


def test_positions_hard_coded_to_the_course_128(tmp_path: Path) -> None:
    # Right for the public model; the hidden model has 320 positions, the benchmark's
    # 1000 + 20 (prompt and new tokens).
    edit = (
        "self.pos_embedding = nn.Embedding(max_seq_len, d_model)",
        "self.pos_embedding = nn.Embedding(128, d_model)",
    )
    graded = grade_edit(tmp_path, [edit], skip_tags=frozenset())
    assert [graded.score(n) for n in ("2.1", "2.2", "2.4", "2.8")] == [1, 4, 4, 2]
    assert 0 < graded.score("2.6") < 2
    assert "read every size from the constructor's arguments" in graded.output("2.6")
    assert graded.score("2.11") == 0
    assert "pos_embedding.weight is (128, 50) in your model but (1020, 50)" in graded.output("2.11")


def test_forward_returning_only_logits(tmp_path: Path) -> None:
    graded = grade_edit(
        tmp_path, [("        return logits, new_past_kv", "        return logits")], {"2.1", "2.2"}
    )
    assert graded.score("2.2") == 0
    assert "forward must return a pair (logits, new_past_kv)" in graded.output("2.2")
    assert graded.score("2.1") == 1


def test_nan_logits_are_rejected(tmp_path: Path) -> None:
    edit = (
        "        return logits, new_past_kv",
        "        return logits * float('nan'), new_past_kv",
    )
    graded = grade_edit(tmp_path, [edit], {"2.2"})
    assert graded.score("2.2") == 0
    assert "NaN or inf" in graded.output("2.2")


def test_logits_of_the_last_position_only(tmp_path: Path) -> None:
    edit = ("        return logits, new_past_kv", "        return logits[:, -1:, :], new_past_kv")
    graded = grade_edit(tmp_path, [edit], {"2.2"})
    assert graded.score("2.2") == 0
    assert "expected (1, " in graded.output("2.2")


def test_hard_coded_sizes_pass_public_but_fail_hidden_cases(tmp_path: Path) -> None:
    # Scaling by sqrt(50) is right for the public model only: the hidden one has d_model 64.
    edit = ("/ math.sqrt(self.d_model)", "/ math.sqrt(50)")
    graded = grade_edit(tmp_path, [edit], {"2.2", "2.4", "2.6"})
    assert graded.score("2.2") == 4
    assert graded.score("2.4") == 4
    assert 0 < graded.score("2.6") < 2
    assert "hidden cases correct" in graded.output("2.6")
    assert "reference's by" not in graded.output("2.6")  # no expected values leak


def test_generate_returning_a_list(tmp_path: Path) -> None:
    edit = ("        return tokens\n", "        return tokens.tolist()\n")
    graded = grade_edit(tmp_path, [edit], {"2.4", "2.8"})
    assert graded.score("2.8") == 0
    assert "generate must return a torch.Tensor" in graded.output("2.8")
    assert graded.score("2.4") == 4


def test_generate_that_drops_the_prompt(tmp_path: Path) -> None:
    edit = ("        return tokens\n", "        return tokens[:, 1:]\n")
    graded = grade_edit(tmp_path, [edit], {"2.8"})
    assert graded.score("2.8") == 0
    assert "(B, T + max_new_tokens)" in graded.output("2.8")


def test_exit_inside_generate_is_contained(tmp_path: Path) -> None:
    edit = (
        "        tokens = input_ids\n",
        "        import os; os._exit(0)\n        tokens = input_ids\n",
    )
    graded = grade_edit(tmp_path, [edit])
    assert graded.score("2.8") == 0
    assert "stopped the grader's worker" in graded.output("2.8")
    # The worker is restarted and the model rebuilt for the checks that follow.
    assert graded.score("2.2") == 4
    assert graded.score("2.7") == 3


def test_the_harness_is_not_used_by_the_grader(tmp_path: Path) -> None:
    full = frozenset()
    graded = grade_edit(tmp_path, [("ATOL = 1e-2  #", "ATOL = 1e9  #")], skip_tags=full)
    assert graded.part_score("part2") == 30
    graded = grade_edit(tmp_path / "2", [("def evaluate(", "def evaluate_gone(")], skip_tags=full)
    assert graded.part_score("part2") == 30


#: Runs the skeleton's harness as ``python FILE --mode M ...`` would, once for each mode
#: named after the file, in one interpreter (one torch import, not one per mode); each
#: mode's output follows a line naming it.
HARNESS_MODES = """
import runpy, sys
script, data, cases, *modes = sys.argv[1:]
for mode in modes:
    print(f"=== mode {mode}", flush=True)
    sys.argv = [script, "--mode", mode, "--model_state_dict", data, "--test_cases", cases]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:  # the harness ends with its pass rate's exit status
        pass
"""


def harness_failures(submission: Path, *modes: str) -> dict[str, dict[str, int]]:
    """Failures per kind printed by the skeleton's own harness on the public files, by mode."""
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS_MODES, str(submission / FILE),
         str(PUBLIC_DATA / "model_state_dict.pt"), str(PUBLIC_DATA / "test_cases.json"), *modes],
        capture_output=True, text=True, timeout=300, cwd=submission,
    )  # fmt: skip
    outputs = proc.stdout.split("=== mode ")[1:]
    assert [out.split("\n", 1)[0] for out in outputs] == list(modes), proc.stdout + proc.stderr
    failures = {}
    for out in outputs:
        mode, text = out.split("\n", 1)
        assert "Pass rate" in text, proc.stdout + proc.stderr
        kinds = re.findall(r"Test case \d+: ([a-z ]+): failed", text)
        failures[mode] = {
            k: kinds.count(k) for k in ("no cache", "with cache", "one token at a time")
        }
    return failures


def passed(graded, number: str) -> int:
    return int(re.search(r"(\d+) of 10 cases correct", graded.output(number)).group(1))


@pytest.mark.parametrize(
    "name", [None, "no_causal_mask", "mask_not_offset", "positions_not_offset", "post_ln"]
)
def test_harness_verdicts_match_the_public_checks(name: str | None, tmp_path: Path) -> None:
    if name is None:
        submission = SOLUTION
    else:
        mutant = next(m for m in load_mutants("part2") if m.name == name)
        submission = mutant.materialise()
    try:
        failures = harness_failures(submission, "kv_evaluate", "evaluate")
        local = failures["kv_evaluate"]
        assert failures["evaluate"]["no cache"] == local["no cache"]
        graded = run_grade(
            submission, tmp_path, parts=["part2"], limits=PART2_LIMITS, skip_tags=NO_BENCHMARK,
            numbers=frozenset({"2.2", "2.3", "2.4"}),
        )  # fmt: skip
    finally:
        if name is not None:
            shutil.rmtree(submission, ignore_errors=True)
    assert local["no cache"] == 10 - passed(graded, "2.2")
    assert local["with cache"] == 10 - passed(graded, "2.3")
    assert local["one token at a time"] == 10 - passed(graded, "2.4")


def test_a_cached_generate_that_never_feeds_the_prompt(tmp_path: Path) -> None:
    """The prefill gets only the prompt's last token: 2.9 counts the tokens forward saw."""
    skip_prompt = (
        "                logits, past_kv = self.prefill(tokens)",
        "                logits, past_kv = self.prefill(tokens[:, -1:])",
    )
    graded = grade_edit(tmp_path, [skip_prompt], {"2.2", "2.9"})
    assert graded.score("2.9") == 0
    assert "the whole prompt must go through forward once" in graded.output("2.9")
    assert graded.score("2.2") == graded.test("2.2")["max_score"]  # forward itself is right


def test_a_prefill_one_token_at_a_time_is_a_reasonable_reading(tmp_path: Path) -> None:
    """Feeding the prompt token by token through the cache sees every token once."""
    sequential = (
        "                logits, past_kv = self.prefill(tokens)",
        "                for i in range(tokens.shape[1]):\n"
        "                    one = tokens[:, i : i + 1]\n"
        "                    logits, past_kv = self.decode_one_token(one, past_kv)",
    )
    graded = grade_edit(tmp_path, [sequential], {"2.9"})
    assert graded.score("2.9") == graded.test("2.9")["max_score"], graded.output("2.9")


def test_a_cached_generate_bug_is_not_blamed_on_the_temperature(tmp_path: Path) -> None:
    """Check 2.10 blames the temperature only when the cache-free generate shows it too;
    a cached generate that feeds forward the wrong tokens is pointed at its own path."""
    mutant = next(m for m in load_mutants("part2") if m.name == "generate_refeeds_with_cache")
    graded = grade_edit(tmp_path, list(mutant.edits), {"2.10"})
    message = graded.output("2.10")
    assert graded.score("2.10") == 0
    assert "dividing the logits by a tiny temperature" not in message
    assert "generate(use_cache=False) picked the token your own model ranks highest" in message
    assert "see checks 2.8 and 2.9" in message


def test_positions_in_feedback_are_counted_from_1(tmp_path: Path) -> None:
    """Positions restarting at 0 in every cached call: one token at a time the first
    position is right and the second is wrong, which the feedback calls position 2."""
    mutant = next(m for m in load_mutants("part2") if m.name == "positions_not_offset")
    graded = grade_edit(tmp_path, list(mutant.edits), {"2.4"})
    first_case = graded.output("2.4").splitlines()[2]
    assert re.search(r"first wrong position 2 of \d+\.$", first_case), first_case


def test_a_wrong_default_temperature_loses_2_10(tmp_path: Path) -> None:
    """generate's default temperature is the handout's 1.0: the default-temperature draws
    are judged against softmax(logits / 1.0), and the feedback tells a wrong default from
    a wrong sampler by drawing again with temperature=1.0 passed explicitly."""
    hot = ("        temperature: float = 1.0,\n", "        temperature: float = 2.0,\n")
    graded = grade_edit(tmp_path, [hot], {"2.10"})
    assert graded.score("2.10") == 0
    assert "generate's default temperature must be 1.0" in graded.output("2.10")
    floor = ("softmax(logits / temperature, dim=-1)", "softmax(logits // temperature, dim=-1)")
    graded = grade_edit(tmp_path / "floor", [floor], {"2.10"})
    assert graded.score("2.10") == 0
    assert "the logits divided by the temperature as real numbers" in graded.output("2.10")


def test_a_nan_probability_never_passes_the_sampling_band() -> None:
    p = float(softmax64(np.array([np.nan, 1.0]))[0])
    assert not abs(0.5 - p) <= frequency_band(p, 1000)


@pytest.mark.parametrize(
    ("lengths", "fine"),
    [
        ([10, 1, 1, 1], True),  # the prompt, then one token per call
        ([10, 1, 1, 1, 1], True),  # a last, unused call
        ([6, 4, 1, 1, 1], True),  # the prompt in chunks
        ([10, 1, 1, 13], False),  # starts over
        ([10, 2, 3, 4], False),  # feeds the last few tokens again
        ([10, 11, 12, 13], False),  # no cache at all
        ([8, 1, 1, 1], False),  # part of the prompt never fed
    ],
)
def test_timed_cached_runs_must_feed_each_token_once(lengths: list[int], fine: bool) -> None:
    from grader.parts.part2.timed import calls_problem

    assert (calls_problem([None, lengths], 10, 4) == "") is fine
