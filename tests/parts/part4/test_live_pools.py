"""A profile whose benchmark GPT-2 has sizes of its own (the cuda profile's GPU workload):
check 4.6's prompts are built in the grading by the reference, on the grading device, and
the submission's timed runs must return the reference's tokens for them. Exercised on the
CPU with a small model through ``KVGRADER_THRESHOLDS``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from grader.core.thresholds import load_thresholds
from grader.parts.part4.pools import runs_per_grading
from grader.parts.part4.support import bench_spec
from grader.runtime.context import load_cases
from tests.conftest import (
    FAST_LIMITS,
    SOLUTION,
    Graded,
    grade_checks,
    patched_solution,
    with_profile,
)

PROFILE = """
[cpu.part4]
model = { n_embd = 48, n_layer = 2, n_head = 4 }
L_values = [4, 12]
warmup = 0
repeats = 1
confirm_repeats = 0
max_cached_growth = 50.0
min_no_cache_growth = 1.0001
min_speedup = 1.0001
"""
DUMMY = (
    "    return generate_with_cache_from(model, input_ids, None, L)\n",
    "    return torch.cat([input_ids, input_ids[:, :1].repeat(1, L)], dim=1)  # no model\n",
)


@pytest.fixture
def own_model_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    with_profile(tmp_path, monkeypatch, "[cpu.part4]", PROFILE)
    return tmp_path


def grade_46(submission: Path, out: Path) -> Graded:
    return grade_checks(submission, out, "part4", {"4.6"}, FAST_LIMITS)


def test_the_benchmark_model_takes_the_profiles_sizes(own_model_profile: Path) -> None:
    bench = load_thresholds("cpu")["part4"]
    cases = load_cases("part4")
    spec = bench_spec(cases, bench)
    lab = cases["models"]["lab"]
    assert spec["config"] == {**lab["config"], "n_embd": 48, "n_layer": 2, "n_head": 4}
    assert spec["seed"] == lab["seed"]
    assert spec["on_device"] is True and "on_device" not in lab  # drawn where it runs
    assert runs_per_grading(bench) == 4  # 2 modes x 2 L values x 1 round
    assert bench_spec(cases, load_thresholds("cuda")["part4"])["config"]["n_positions"] >= 520


def test_the_reference_answers_the_prompts_it_built(own_model_profile: Path) -> None:
    graded = grade_46(SOLUTION, own_model_profile / "solution")
    output = graded.output("4.6")
    assert "did not return the reference's" not in output, output
    assert "L = 12" in output


def test_dummy_tokens_lose_the_points(own_model_profile: Path) -> None:
    submission = patched_solution(own_model_profile / "dummy", "kv_lab.py", [DUMMY])
    graded = grade_46(submission, own_model_profile / "dummy_out")
    assert graded.score("4.6") == 0
    assert "did not return the reference's" in graded.output("4.6")
    assert "drawn for this grading" in graded.output("4.6")


def test_timed_runs_reply_with_tokens_only(own_model_profile: Path) -> None:
    """A GPU workload's timed run at L = 512 would send 100 MB of logits, past the reply
    limit: timed runs ask for their tokens alone, so the reference passes under a reply
    limit that its logits (16 steps of the lab vocabulary, 32 KB) would overflow."""
    limits = replace(FAST_LIMITS, max_response_bytes=16 * 2**10)
    graded = grade_checks(SOLUTION, own_model_profile / "small", "part4", {"4.6"}, limits)
    output = graded.output("4.6")
    assert "byte limit" not in output, output
    assert "with the cache, L = 12: median" in output, output


class _Drawer:
    """A reference worker stand-in: every generate request's rows get the gaps ``gap``
    says (a row of a rejected prompt wins a step by less than the margin)."""

    starts = 1

    def __init__(self, gap) -> None:
        self.gap, self.batches = gap, []

    def request(self, header, arrays=None, **_):
        from grader.runtime.outcomes import Reply

        if header["op"] != "generate":
            return Reply(header={}, arrays={})
        ids = arrays["ids"]  # (B, PROMPT_LEN)
        self.batches.append(ids.shape)
        rows = range(len(self.batches) * 100, len(self.batches) * 100 + ids.shape[0])
        gaps = np.array([[self.gap(r) for r in rows]] * header["n"])  # (steps, B)
        tokens = np.concatenate([ids, np.zeros((ids.shape[0], header["n"]), np.int64)], 1)
        return Reply(header={}, arrays={"tokens": tokens, "step_gaps": gaps})


def _context(drawer: _Drawer):
    import contextlib
    from types import SimpleNamespace

    built: dict[str, dict[str, int]] = {}
    return SimpleNamespace(
        limits=FAST_LIMITS,
        reference_session=lambda part, **_: contextlib.nullcontext(drawer),
        built=lambda part: built.setdefault(part, {}),
    )


def test_the_pool_is_drawn_a_batch_of_candidates_at_a_time() -> None:
    """One request continues as many candidates as the grading has timed runs (on a GPU
    a step costs about the same for all of them as for one), and the next batch tops the
    pool up when some candidates' greedy steps win by too little."""
    from grader.parts.part4 import live_pools
    from grader.parts.part4.pools import MARGIN, PROMPT_LEN

    bench = {"L_values": [4, 12], "warmup": 1, "repeats": 1, "confirm_repeats": 0}
    spec = {"config": {"vocab_size": 50}, "seed": 1}
    size = runs_per_grading(bench)
    drawer = _Drawer(lambda row: MARGIN * (10 if row % 3 else 0.5))  # a third rejected
    cases = live_pools.live_pool(_context(drawer), spec, bench)
    assert drawer.batches == [(size, PROMPT_LEN)] * 2
    assert len(cases) == size and all(len(c["tokens"][0]) == PROMPT_LEN + 12 for c in cases)
    never = _Drawer(lambda row: MARGIN)  # no step wins by more than the margin
    with pytest.raises(RuntimeError, match="whose greedy steps all win"):
        live_pools.live_pool(_context(never), spec, bench)
    assert len(never.batches) == live_pools.MAX_DRAWS


def test_the_pools_reference_worker_is_timed_as_the_yardstick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace_lines: Callable[[], list[dict]]
) -> None:
    """The worker that drew the prompts is timed right after, on the GPT-2 it built: one
    reference worker and one build (on a GPU a Part 4 worker's start took 14-17 s)."""
    with_profile(tmp_path, monkeypatch, "[cpu.part4]", PROFILE + "max_vs_reference = 50.0\n")
    graded = grade_46(SOLUTION, tmp_path / "out")
    assert "did not return the reference's" not in graded.output("4.6"), graded.output("4.6")
    rows = trace_lines()
    reference = [r for r in rows if r["trusted"]]
    assert len({r["pid"] for r in reference}) == 1
    assert [r["what"] for r in reference if r["op"] == "build"] == ["the reference's GPT-2"]
    assert any(r["timed"] for r in reference)  # the yardstick, in the same worker
