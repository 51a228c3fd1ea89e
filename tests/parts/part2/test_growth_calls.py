"""Check 2.9's growth probe judges the forward calls of its cached runs, as the worker
records them (``adapter.run_generate``): its long runs show a ``generate`` that starts over
every few steps, at any period up to 64, where the benchmark's 20 new tokens cannot. Run
here in this process on the public model, whose 128 positions hold a prompt of the
probe's length and 100 new tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from grader.parts.part2 import adapter
from grader.parts.part2.build import load
from grader.parts.part2.cases import GROWTH_PROMPT, PUBLIC_MODEL
from grader.parts.part2.timed import Part2Growth
from grader.ta.regen import import_path, one_thread
from tests.conftest import SOLUTION, patched_solution
from tests.grading.test_partial_caches import every_kth_step, refreshed_in_forward

FILE = "transformer_skeleton.py"
NEW_TOKENS = 100


@pytest.fixture(autouse=True)
def torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


def growth_calls_problem(root: Path, new_tokens: int = NEW_TOKENS) -> str:
    """What the growth probe says of one cached run of ``root``'s generate."""
    module = import_path(root / FILE, f"part2_growth_calls_{abs(hash(root))}")
    model = load(module, PUBLIC_MODEL)
    vocab = PUBLIC_MODEL["config"]["vocab_size"]
    ids = np.random.default_rng(0).integers(0, vocab, (2, GROWTH_PROMPT))
    lengths = adapter.run_generate(model, ids, new_tokens, None, None, 0)["forward_lengths"]
    probe = Part2Growth.__new__(Part2Growth)  # the judgement alone, no grading around it
    probe.growth_calls = [(None, new_tokens), (lengths, new_tokens)]  # None: no record
    return probe.growth_calls_problem()


def test_the_reference_feeds_its_prompt_once_then_one_token_per_call() -> None:
    assert growth_calls_problem(SOLUTION) == ""


def test_a_refresh_inside_forward_looks_like_a_cache_here(tmp_path: Path) -> None:
    """One token a call: the cache-read probe names that design, not the call records."""
    root = patched_solution(tmp_path / "sub", FILE, refreshed_in_forward(8))
    assert growth_calls_problem(root) == ""


@pytest.mark.parametrize("period", [4, 32, 64])
def test_a_generate_that_starts_over_every_few_steps_is_named(tmp_path: Path, period: int) -> None:
    root = patched_solution(tmp_path / "sub", FILE, every_kth_step(period))
    problem = growth_calls_problem(root)
    assert "recomputes part of the work" in problem
    assert f"for a prompt of {GROWTH_PROMPT} tokens and {NEW_TOKENS} new tokens" in problem
    assert growth_calls_problem(root, period) == ""  # a run within the period shows nothing
