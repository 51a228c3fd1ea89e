"""End-to-end grading of Part 4 (the KV-cache lab): the solution, the blank skeleton,
the bonus and its feedback."""

from __future__ import annotations

import re

import pytest

from grader.core.points import BONUS, POINTS, part_total
from grader.core.thresholds import load_thresholds
from tests.conftest import patched_solution, run_grade

CHECKS = set(POINTS["part4"]) | {k for k in BONUS if k.startswith("4.")}


def test_solution_gets_full_marks_and_the_bonus(solution_graded) -> None:
    tests = solution_graded.part_tests("part4")
    assert {t["number"] for t in tests} == CHECKS
    assert [t["number"] for t in tests if t["status"] != "passed"] == []
    assert part_total("part4") == 20
    assert solution_graded.part_score("part4") == 20 + BONUS["4.7"]
    bonus = solution_graded.test("4.7")
    assert bonus["max_score"] == 0 and bonus["score"] == BONUS["4.7"]
    assert "bonus" in bonus["tags"]


def test_latency_and_int8_figures_are_reported(solution_graded) -> None:
    latency = solution_graded.output("4.6")
    # On the CPU profile the verdicts are on the worker's CPU time, read by the grader.
    assert re.search(r"cached CPU time per token, L = 256 over L = 32: [0-9.]+x", latency)
    assert re.search(r"cache-free over cached CPU time per token, L = 256: [0-9.]+x", latency)
    record = solution_graded.data["extra_data"]["benchmarks"]["4.6"]
    growth = {c["key"]: c["ratio"]["median"] for c in record["criteria"]}
    assert growth["part4.max_cached_growth"] < growth["part4.min_no_cache_growth"]
    assert growth["part4.min_speedup"] > 1
    # Timed against the reference's cached path in the same grading.
    assert growth["part4.max_vs_reference"] <= load_thresholds("cpu")["part4"]["max_vs_reference"]
    assert "with the cache, L = 256, over the reference's (cpu time)" in latency
    # The per-variant lines are per generated token, not whole generations: a cached run
    # of 256 tokens takes about 8 times one of 32, its time per token about the same.
    timings = record["timings"]
    per_token = (
        timings["with the cache, L = 256"]["median_s"]
        / timings["with the cache, L = 32"]["median_s"]
    )
    assert per_token < 4
    assert "benchmark" in solution_graded.test("4.6")["tags"]
    int8 = solution_graded.output("4.7")
    ratio = float(re.search(r"= ([0-9.]+) x the fp16 cache", int8).group(1))
    assert ratio <= 0.55


def test_blank_skeleton_scores_zero_without_crashing(blank_graded) -> None:
    tests = blank_graded.part_tests("part4")
    assert {t["number"] for t in tests} == CHECKS
    assert blank_graded.part_score("part4") == 0
    assert "not implemented yet" in blank_graded.output("4.5")


def test_a_timed_run_with_wrong_tokens_does_not_count(tmp_path) -> None:
    edit = (
        "return generate_with_cache_from(model, input_ids, None, L)",
        "return generate_with_cache_from(model, input_ids, None, L) % 7",
    )
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [edit])
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], tags=frozenset({"benchmark"}))
    assert graded.score("4.6") == 0
    output = graded.output("4.6")
    assert "so its time cannot count" in output
    # The cached path is wrong, and it is the one blamed: each timed run is compared with
    # the reference's tokens, not with the other mode's.
    assert "(generate_with_cache, " in output
    assert "without the cache" not in output and "generate_no_cache" not in output


FORGED_INT8 = """

import sys as _sys

_adapter = _sys.modules.get("adapter_part4")
if _adapter is not None:  # the worker's adapter, replaced from inside the submission
    def _forged_report(*args, **kwargs):
        return {"q_bytes": 1000, "fp16_bytes": 4000, "dtypes": ["torch.int8"],
                "max_rel_error": 0.001, "agree": 1.0}
    _adapter.run_int8 = _forged_report
"""


def test_a_forged_int8_report_earns_no_bonus(tmp_path) -> None:
    edits = [
        (
            "    pairs = kv_pairs(past_key_values)\n    layers = []",
            "    raise NotImplementedError\n    layers = []",
        ),
        ('if __name__ == "__main__":', FORGED_INT8 + '\n\nif __name__ == "__main__":'),
    ]
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", edits)
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], tags=frozenset({"bonus"}))
    assert graded.score("4.7") == 0


def test_measure_latency_with_other_defaults_loses_4_8_and_is_told_which(tmp_path) -> None:
    """The timed case with the handout's defaults: a default of no warm-up times the first
    generation of all, which nothing warmed up."""
    edit = ("    warmup: int = 1,\n", "    warmup: int = 0,\n")
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [edit])
    graded = run_grade(
        submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.2", "4.8"})
    )
    assert graded.score("4.8") == 0
    output = graded.output("4.8")
    assert "with the handout's defaults returned" in output
    assert "its timed runs include the first generation it ran" in output
    assert "times every run in measure_latency, the first (slow) one included" in output
    assert "the defaults must be the handout's (prompt_len=8, warmup=1, repeats=3)" in output
    assert graded.score("4.2") == POINTS["part4"]["4.2"]


def test_an_unguarded_all_zero_vector_loses_the_bonus_and_is_told_why(tmp_path) -> None:
    edit = ("torch.where(scale == 0, torch.ones_like", "torch.where(scale < 0, torch.ones_like")
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [edit])
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], tags=frozenset({"bonus"}))
    assert graded.score("4.7") == 0
    assert "0 / 0; the handout stores a scale of 1 where max|x| is 0" in graded.output("4.7")


def test_a_lab_timed_with_time_monotonic_keeps_4_8(tmp_path) -> None:
    """The lab leaves the clock open: time.monotonic (or time.time) is as right as
    time.perf_counter, so the grader drives it too."""
    edit = ("time.perf_counter()", "time.monotonic()")
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [])
    path = submission / "kv_lab.py"
    path.write_text(path.read_text().replace(*edit))
    assert "perf_counter()" not in path.read_text().split("def measure_latency")[1][:2000]
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.8"}))
    assert graded.score("4.8") == POINTS["part4"]["4.8"], graded.output("4.8")


def test_the_course_labs_pair_loop_over_the_cache_is_named(tmp_path) -> None:
    """``for k, v in past_key_values`` was right for the transformers the course's lab was
    written for; on the pinned one it raises a bare unpacking error, which the feedback
    explains in one sentence with the fix."""
    edit = (
        "    return sum(t.numel() * t.element_size() for k, v in kv_pairs(past_key_values) "
        "for t in (k, v))",
        "    return sum(k.numel() * k.element_size() + v.numel() * v.element_size()\n"
        "               for k, v in past_key_values)",
    )
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [edit])
    graded = run_grade(
        submission, tmp_path / "out", parts=["part4"], skip_tags=frozenset({"benchmark"})
    )
    failed = {t["number"]: t.get("output", "") for t in graded.data["tests"] if t["score"] == 0}
    assert failed, "the pair loop went unnoticed"
    for number, output in failed.items():
        assert "too many values to unpack" in output, number
        assert "(keys, values, sliding_window) triples" in output, number
        assert "kv_pairs(past_key_values)" in output, number


def test_other_unpacking_errors_get_no_cache_hint() -> None:
    from grader.parts.part4.support import cache_api_hint
    from grader.runtime.outcomes import SubmissionError

    def error(message: str, line: str) -> SubmissionError:
        tb = f'  File "kv_lab.py", line 9, in f\n    {line}'
        return SubmissionError("x", error={"type": "ValueError", "message": message,
                                           "traceback": tb})  # fmt: skip

    loop = "for k, v in past_key_values:"
    assert cache_api_hint(error("too many values to unpack (expected 2)", loop))
    assert not cache_api_hint(error("too many values to unpack (expected 2)", "a, b = f(x)"))
    assert not cache_api_hint(error("too many values to unpack (expected 3)", loop))
    assert not cache_api_hint(SubmissionError("x", error={"type": "TypeError"}))


def test_a_prefill_that_always_appends_a_token_loses_4_2_at_zero_new_tokens(tmp_path) -> None:
    """The course lab's loop: prefill, append its token, then L - 1 cached steps. Right for
    every L >= 1, one token too many for L = 0; the feedback says why."""
    edit = (
        "    return generate_with_cache_from(model, input_ids, None, L)\n",
        "    out = model(input_ids, use_cache=True)\n"
        "    cache, new = out.past_key_values, out.logits[:, -1].argmax(dim=-1, keepdim=True)\n"
        "    ids = torch.cat([input_ids, new], dim=1)\n"
        "    for _ in range(L - 1):\n"
        "        out = model(new, past_key_values=cache, use_cache=True)\n"
        "        cache, new = out.past_key_values, out.logits[:, -1].argmax(dim=-1, keepdim=True)\n"
        "        ids = torch.cat([ids, new], dim=1)\n"
        "    return ids\n",
    )
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [edit])
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.2"}))
    assert 0 < graded.score("4.2") < POINTS["part4"]["4.2"]
    output = graded.output("4.2")
    shape = re.search(r"generate_with_cache\(model, input_ids \((\d+), (\d+)\), 0\) returned "
                      r"shape \((\d+), (\d+)\)", output)  # fmt: skip
    assert shape, output
    batch, length, got_batch, got_length = map(int, shape.groups())
    assert (got_batch, got_length) == (batch, length + 1)
    assert "the token the prefill picks is the first of the L new tokens" in output
    assert "generate_no_cache(model" not in output  # the cache-free path was right


def test_an_untimed_warm_up_pass_before_the_loop_keeps_4_8(tmp_path) -> None:
    """The handout's loop plus one untimed cached generation before it (a warm-up of the
    lab's own): extra untimed work is allowed."""
    edit = (
        '    for L in L_values:\n        result["L"].append(int(L))\n',
        "    generate_with_cache(model, prompt, 2)  # untimed warm-up of the cached path\n"
        '    for L in L_values:\n        result["L"].append(int(L))\n',
    )
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", [edit])
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.8"}))
    assert graded.score("4.8") == POINTS["part4"]["4.8"], graded.output("4.8")


# generate_no_cache through the cache: its model calls are not the handout's, so 4.8's
# timed cases find its generations by the generate calls measure_latency makes.
NO_CACHE_VIA_CACHE = (
    "@torch.no_grad()\ndef generate_no_cache(model: torch.nn.Module,",
    "@torch.no_grad()\ndef generate_no_cache(model, input_ids, L):\n"
    "    return generate_with_cache_from(model, input_ids, None, L)\n\n\n"
    "@torch.no_grad()\ndef _handout_no_cache(model: torch.nn.Module,",
)
TIMED_BY_THE_GRADER = "Timed by the grader, generation by generation"


@pytest.mark.parametrize("fixed", [False, True], ids=["passed values", "fixed counts"])
def test_generations_are_found_by_the_generate_calls_too(tmp_path, fixed) -> None:
    edits = [NO_CACHE_VIA_CACHE]
    if fixed:  # the handout's defaults written into the loop
        edits += [("for i in range(warmup + repeats):", "for i in range(1 + 3):"),
                  ("if i >= warmup:", "if i >= 1:")]  # fmt: skip
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", edits)
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.8"}))
    output = graded.output("4.8")
    if fixed:
        assert graded.score("4.8") == 0
        assert "generate_no_cache ran 4 times for that L, fewer than the repeats = 5" in output
        assert "made the same 4 generations per L and mode" in output  # found by isolation
    else:
        assert graded.score("4.8") == POINTS["part4"]["4.8"], output
        assert TIMED_BY_THE_GRADER in output


# The course lab's habits: ten passes of the model as its warm-up (the lab leaves the
# warm-up open), then `repeats` timed runs per L and mode, averaged (the mean).
OWN_WARMUP = [
    ('    for L in L_values:\n        result["L"].append(int(L))\n',
     "    for _ in range(10):  # warm up: ten passes of the model\n"
     "        model(prompt)\n"
     '    for L in L_values:\n        result["L"].append(int(L))\n'),
    ("for i in range(warmup + repeats):", "for i in range(repeats):"),
    ("if i >= warmup:", "if True:"),
    ("statistics.median(times)", "statistics.mean(times)"),
]  # fmt: skip


@pytest.mark.parametrize("via_cache", [False, True], ids=["handout calls", "other calls"])
def test_a_warm_up_of_model_passes_and_the_mean_keep_4_8(tmp_path, via_cache: bool) -> None:
    """The course's lab says "average latency per token" and nothing of a warm-up: ten
    model passes in place of `warmup` generate runs, and the mean of the timed runs, are
    as right as the kit's loop, whatever calls the generate functions make."""
    edits = [NO_CACHE_VIA_CACHE, *OWN_WARMUP] if via_cache else OWN_WARMUP
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", edits)
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.8"}))
    output = graded.output("4.8")
    assert graded.score("4.8") == POINTS["part4"]["4.8"], output
    assert TIMED_BY_THE_GRADER in output


def test_a_generation_with_autograd_on_loses_4_6_only_and_is_named(tmp_path) -> None:
    """The grader calls the generate functions as a script would: one that leaves out
    torch.no_grad() builds autograd's graph, which 4.6 sees from the logits and names;
    its tokens (4.2) and measure_latency's figures of its own runs (4.8) stay right."""
    graded = mutant_graded(tmp_path, "generation_with_autograd", {"4.2", "4.6", "4.8"})
    assert graded.score("4.6") == 0
    output = graded.output("4.6")
    assert "ran the model with autograd on" in output
    assert graded.test("4.6")["extra_data"]["causes"] == ["generation_with_autograd"]
    assert graded.score("4.2") == POINTS["part4"]["4.2"]
    assert graded.score("4.8") == POINTS["part4"]["4.8"], graded.output("4.8")


def test_theoretical_bytes_without_the_factor_2_is_named_once(tmp_path) -> None:
    graded = mutant_graded(tmp_path, "theory_without_factor_2", {"4.4"})
    output = graded.output("4.4")
    assert graded.score("4.4") == 0
    assert graded.test("4.4")["extra_data"]["causes"] == ["theory_without_factor_2"]
    assert output.count("leaves out the factor 2 in theoretical_kv_bytes") == 1, output
    assert re.search(r"\b(\d+) of \1 cases returned a wrong value, all wrong in the same way",
                     output), output  # fmt: skip
    assert len(re.findall(r"theoretical_kv_bytes\(.*?\) returned [\d,]+", output)) == 1, output


def mutant_graded(tmp_path, name: str, numbers: set[str]):
    """The reference with one catalogued mistake, graded on ``numbers`` only."""
    from grader.ta.mutants import load_mutants

    [mutant] = [m for m in load_mutants("part4") if m.name == name]
    submission = patched_solution(tmp_path / "submission", mutant.file, mutant.edits)
    return run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset(numbers))


def test_a_cache_fed_the_whole_sequence_gets_its_own_cause_once(tmp_path) -> None:
    """It passes the cache back (the grader records that), so "never passes the cache
    back" is not named; 4.6's IndexError is named as positions past n_positions."""
    graded = mutant_graded(tmp_path, "whole_sequence_with_cache", {"4.2", "4.6"})
    causes = graded.test("4.2")["extra_data"]["causes"]
    assert "whole_sequence_with_cache" in causes
    assert "cache_never_passed_back_recomputes" not in causes
    assert "never passes it back" not in graded.output("4.2")
    assert "IndexError" in graded.output("4.6")
    assert "positions past its n_positions (512)" in graded.output("4.6")


def test_a_bare_uint8_cast_is_named_once(tmp_path) -> None:
    graded = mutant_graded(tmp_path, "uint8_cast", {"4.7"})
    output = graded.output("4.7")
    assert output.count("bare .to(torch.uint8) cast") == 1
    assert output.count("The cache is a bare uint8 cast") == 1


def test_every_timed_run_of_4_6_gets_a_prompt_of_its_own(tmp_path) -> None:
    """A generate that refuses a prompt it has seen before (what a memo keyed by the
    prompt would answer, e.g. the L = 256 run from the L = 32 run of the same round)
    still passes 4.6: no two timed runs share a prompt, across modes, L and rounds."""
    seen = (
        "_SEEN = set()\n\n\ndef _fresh(input_ids):\n"
        "    key = tuple(input_ids.flatten().tolist())\n"
        "    if key in _SEEN:\n        raise RuntimeError('a prompt came back')\n"
        "    _SEEN.add(key)\n\n\n"
    )
    edits = [
        ("@torch.no_grad()\ndef generate_no_cache(",
         f"{seen}@torch.no_grad()\ndef generate_no_cache("),
        ("    # BEGIN SOLUTION\n    ids = input_ids  # (B, T)\n",
         "    # BEGIN SOLUTION\n    _fresh(input_ids)\n    ids = input_ids  # (B, T)\n"),
        ("    # BEGIN SOLUTION\n    return generate_with_cache_from(model, input_ids, None, L)",
         "    # BEGIN SOLUTION\n    _fresh(input_ids)\n"
         "    return generate_with_cache_from(model, input_ids, None, L)"),
    ]  # fmt: skip
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", edits)
    graded = run_grade(submission, tmp_path / "out", parts=["part4"], numbers=frozenset({"4.6"}))
    assert "a prompt came back" not in graded.output("4.6")
    assert graded.score("4.6") == graded.test("4.6")["max_score"], graded.output("4.6")
