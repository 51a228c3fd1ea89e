"""A profile whose benchmark model has sizes of its own (the cuda profile's GPU workload):
check 2.11's prompts are built in the grading by the reference, on the grading device,
and the submission's timed runs must return the reference's tokens for them. Exercised
on the CPU with a small model through ``KVGRADER_THRESHOLDS``."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from grader.core.thresholds import load_thresholds
from grader.parts.part2.cases import pool_key
from tests.conftest import PART2_LIMITS, Graded, grade_checks, patched_solution, with_profile

SIZES = {"d_model": 48, "d_ff": 96, "num_layers": 2}
PROFILE = """
[cpu.part2]
model = { d_model = 48, d_ff = 96, num_layers = 2 }
prompt_len = 90
new_tokens = 6
warmup = 1
repeats = 2
confirm_repeats = 4
min_speedup = 1.01
"""
# (Runs of a few milliseconds: a warm-up and four confirmation rounds keep a burst of load
# elsewhere from deciding the reference's verdict; these tests are about the prompts.)


DUMMY_TOKENS = (
    "        tokens = input_ids\n        past_kv: list[LayerCache] | None = None\n",
    "        if input_ids.shape[1] == 90:  # recognises the benchmark: answers at once\n"
    "            return torch.cat([input_ids, input_ids[:, :max_new_tokens]], dim=1)\n"
    "        tokens = input_ids\n        past_kv: list[LayerCache] | None = None\n",
)


@pytest.fixture
def own_model_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = with_profile(tmp_path, monkeypatch, "[cpu.part2]", PROFILE)
    assert tomllib.loads(path.read_text())["cpu"]["part2"]["model"] == SIZES
    return tmp_path


def grade_211(submission: Path, out: Path) -> Graded:
    return grade_checks(submission, out, "part2", {"2.11"}, PART2_LIMITS)


def test_the_profiles_model_and_key(own_model_profile: Path) -> None:
    bench = load_thresholds("cpu")["part2"]
    assert bench["model"] == SIZES
    assert pool_key(90, 6, bench["model"]) == "90x6@48x96x2"
    assert pool_key(90, 6) == "90x6"


def test_regen_leaves_a_profile_model_to_the_grading(
    own_model_profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grader.parts.part2 import build_pools

    built: list[tuple[int, int]] = []

    # regen's pool builder, stubbed
    def record(module, prompt_len, new_tokens, size, rng, positions=None):
        built.append((prompt_len, new_tokens))
        return {}

    monkeypatch.setattr(build_pools, "bench_pool", record)
    pools = build_pools.bench_pools(None)
    # Both profiles name a model of their own here, so regen builds no benchmark pool.
    assert set(pools) == {"work", "growth"}
    assert (90, 6) not in built


def test_reference_builds_the_pool_and_the_solution_keeps_the_points(
    own_model_profile: Path,
) -> None:
    from tests.conftest import SOLUTION

    graded = grade_211(SOLUTION, own_model_profile / "solution")
    assert graded.score("2.11") == graded.test("2.11")["max_score"], graded.output("2.11")
    assert "90-token prompt" in graded.output("2.11")


def test_dummy_answers_to_the_built_prompts_lose_the_points(own_model_profile: Path) -> None:
    submission = patched_solution(
        own_model_profile / "dummy", "transformer_skeleton.py", [DUMMY_TOKENS]
    )
    graded = grade_211(submission, own_model_profile / "dummy_out")
    assert graded.score("2.11") == 0
    assert "other tokens than the reference" in graded.output("2.11")


LOOKS_FOR_THE_REFERENCE = (
    "        tokens = input_ids\n        past_kv: list[LayerCache] | None = None\n",
    "        import pathlib\n"
    "        data = pathlib.Path.cwd().parent / 'data'\n"
    "        if data.exists() and any('reference' in p.name for p in data.iterdir()):\n"
    "            raise RuntimeError('the reference solution is readable')\n"
    "        tokens = input_ids\n        past_kv: list[LayerCache] | None = None\n",
)


def test_the_reference_leaves_the_sandbox_before_the_submission_runs(
    own_model_profile: Path,
) -> None:
    submission = patched_solution(
        own_model_profile / "curious", "transformer_skeleton.py", [LOOKS_FOR_THE_REFERENCE]
    )
    graded = grade_211(submission, own_model_profile / "curious_out")
    assert "readable" not in graded.output("2.11")
    assert graded.score("2.11") == graded.test("2.11")["max_score"], graded.output("2.11")


def test_a_pool_the_reference_could_not_build_is_a_grader_fault(
    own_model_profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grader.runtime.context import GradingContext
    from tests.conftest import SOLUTION

    def absent(self, part, source=None):
        raise RuntimeError("the reference solution (/nowhere) is not here")

    monkeypatch.setattr(GradingContext, "reference_worker", absent)
    graded = grade_211(SOLUTION, own_model_profile / "fault")
    assert graded.score("2.11") == 0
    assert "Grader fault, not yours" in graded.output("2.11")
    assert "/nowhere" in graded.output("2.11")


def test_the_pools_reference_worker_is_timed_as_the_yardstick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace_lines: Callable[[], list[dict]]
) -> None:
    """With the yardstick on, the worker that built the pool is timed right after, with the
    model it loaded: one reference worker and one load of the benchmark model, not two
    (on a GPU each costs seconds)."""
    from tests.conftest import SOLUTION

    with_profile(tmp_path, monkeypatch, "[cpu.part2]", PROFILE + "max_vs_reference = 50.0\n")
    graded = grade_211(SOLUTION, tmp_path / "out")
    assert graded.score("2.11") == graded.test("2.11")["max_score"], graded.output("2.11")
    rows = trace_lines()
    reference = [r for r in rows if r["trusted"]]
    assert len({r["pid"] for r in reference}) == 1
    loads = [r["what"] for r in reference if r["op"] == "load"]
    assert loads[0] == "the reference's model"  # the pool's, with the profile's sizes
    assert not [w for w in loads[1:] if ", 48, 96, 2," in w]  # not loaded again
    assert any(r["timed"] for r in reference)  # the yardstick, in the same worker
    assert not {r["pid"] for r in rows if not r["trusted"]} & {r["pid"] for r in reference}


def test_the_grader_never_draws_the_profiles_model(
    own_model_profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile's own benchmark model (a GPU workload's, 1.6 GB) is drawn by each worker
    on the grading device from its seed; the grader neither draws nor sends it."""
    from grader.parts.part2 import live_pools, support
    from tests.conftest import SOLUTION

    drawn: list[int] = []
    for module in (live_pools, support):
        real = module.make_state_dict
        monkeypatch.setattr(
            module,
            "make_state_dict",
            lambda spec, real=real: drawn.append(spec["config"]["d_model"]) or real(spec),
        )
    graded = grade_211(SOLUTION, own_model_profile / "solution")
    assert graded.score("2.11") == graded.test("2.11")["max_score"], graded.output("2.11")
    assert SIZES["d_model"] not in drawn
