"""A profile whose benchmark Llama has sizes of its own (the cuda profile's GPU workload):
check 3.11's prompts are built in the grading by the reference, on the grading device,
and the submission's timed runs must return the reference's text for them. Exercised on
the CPU with a small model through ``KVGRADER_THRESHOLDS``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from grader.core.thresholds import load_thresholds
from grader.parts.part3.cases import pool_key
from tests.conftest import (
    PART2_LIMITS,
    SOLUTION,
    Graded,
    grade_checks,
    patched_solution,
    with_profile,
)

PROFILE = """
[cpu.part3]
model = { dim = 32, n_layers = 1, n_heads = 4, n_kv_heads = 2 }
batch_sizes = [1, 2]
input_len = 24
output_len = 4
warmup = 0
repeats = 1
confirm_repeats = 0
min_speedup = { "1" = 1.0001, "2" = 1.0001 }
"""
DUMMY = (
    "        min_prompt_len = min(len(t) for t in prompt_tokens)\n",
    "        if len(prompt_tokens[0]) == 24:  # recognises the benchmark: answers at once\n"
    "            return [[1] * max_gen_len for _ in prompt_tokens]\n"
    "        min_prompt_len = min(len(t) for t in prompt_tokens)\n",
)


@pytest.fixture
def own_model_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    with_profile(tmp_path, monkeypatch, "[cpu.part3]", PROFILE)
    return tmp_path


def grade_311(submission: Path, out: Path) -> Graded:
    return grade_checks(submission, out, "part3", {"3.11"}, PART2_LIMITS)


def test_the_pool_key_names_the_models_sizes(own_model_profile: Path) -> None:
    bench = load_thresholds("cpu")["part3"]
    key = pool_key(24, 4, bench["model"])
    assert key == "24x4@dim=32xn_heads=4xn_kv_heads=2xn_layers=1"
    assert pool_key(24, 4) == "24x4"


def test_the_reference_answers_the_prompts_it_built(own_model_profile: Path) -> None:
    graded = grade_311(SOLUTION, own_model_profile / "solution")
    output = graded.output("3.11")
    assert "other text than the reference" not in output, output
    assert "Grader fault" not in output, output
    assert "batch 2" in output


def test_dummy_text_loses_the_points(own_model_profile: Path) -> None:
    submission = patched_solution(own_model_profile / "dummy", "llama/generation.py", [DUMMY])
    graded = grade_311(submission, own_model_profile / "dummy_out")
    assert graded.score("3.11") == 0
    assert "other text than the reference" in graded.output("3.11")


def test_a_batch_size_without_a_threshold_is_timed_and_reported_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the cuda profile does at batch 1: timed, its speedup printed, no criterion.
    with_profile(tmp_path, monkeypatch, "[cpu.part3]", PROFILE.replace('"1" = 1.0001, ', ""))
    graded = grade_311(SOLUTION, tmp_path / "solution")
    record = graded.data["extra_data"]["benchmarks"]["3.11"]
    assert [c["key"] for c in record["criteria"]] == ["part3.min_speedup.2"]
    assert {"batch 1, with the cache", "batch 1, without the cache"} <= set(record["timings"])
    unjudged = "(cpu time, not graded: the cpu profile judges no speedup at this batch size)"
    assert f"batch 1 speedup {unjudged}: " in graded.output("3.11")
    assert "batch 2 speedup (cpu time, not graded" not in graded.output("3.11")
    assert record["leaderboard"]["speedup"] > 0


def test_the_pools_reference_worker_is_timed_as_the_yardstick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace_lines: Callable[[], list[dict]]
) -> None:
    """The worker that drew the prompts is timed right after, with the benchmark model it
    loaded: one reference worker, one load of that model."""
    with_profile(tmp_path, monkeypatch, "[cpu.part3]", PROFILE + "max_vs_reference = 50.0\n")
    grade_311(SOLUTION, tmp_path / "out")
    rows = trace_lines()
    reference = [r for r in rows if r["trusted"]]
    assert len({r["pid"] for r in reference}) == 1
    loads = [r["what"] for r in reference if r["op"] == "load"]
    assert len([w for w in loads if "the benchmark's sizes" in w]) == 1  # loaded once
    assert any(r["timed"] for r in reference)  # the yardstick, in the same worker


def test_the_grader_never_draws_the_profiles_model(
    own_model_profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check 3.11's model under a profile's sizes (a GPU workload's) is drawn by each
    worker on the grading device from its seed; the grader neither draws nor sends it."""
    from grader.parts.part3 import support

    drawn: list[int] = []
    real = support.make_weights

    def counted(params, vocab, seed):
        drawn.append(params["dim"])
        return real(params, vocab, seed)

    monkeypatch.setattr(support, "make_weights", counted)
    graded = grade_311(SOLUTION, own_model_profile / "solution")
    assert "did not return the reference's" not in graded.output("3.11"), graded.output("3.11")
    assert "batch 2" in graded.output("3.11")
    assert 32 not in drawn  # the profile's dim
