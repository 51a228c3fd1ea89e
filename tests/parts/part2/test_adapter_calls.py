"""grader/parts/part2/adapter_calls.py: the record of generate's forward calls that check
2.9 and the timed runs judge, whichever way generate reaches forward, and forward put back
as it was afterwards. The mutant library's correct variants record a prefill and then one
token per call; a generate that starts over is still seen starting over."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from grader.parts.part2 import adapter
from grader.parts.part2.adapter_calls import forward_calls, tokens_given
from grader.parts.part2.build import load
from grader.parts.part2.cases import PUBLIC_MODEL
from grader.ta.mutants import load_mutants
from grader.ta.regen import import_path, one_thread
from tests.conftest import SOLUTION, patched_solution
from tests.grading.test_partial_caches import every_kth_step

pytestmark = pytest.mark.usefixtures("worker_modules_importable")

FILE = "transformer_skeleton.py"
VARIANTS = {v.name: v for v in load_mutants("part2", variants=True)}
PROMPT, NEW = 6, 5


@pytest.fixture(autouse=True)
def torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


def recorded(root: Path, use_cache: bool | None) -> list[int]:
    """The forward calls run_generate records for ``root``'s generate on the public model."""
    sys.path.insert(0, str(root))  # a variant's own helper module sits beside its file
    try:
        module = import_path(root / FILE, f"part2_adapter_calls_{abs(hash((root, use_cache)))}")
    finally:
        sys.path.remove(str(root))
    model = load(module, PUBLIC_MODEL)
    forward = vars(type(model))["forward"]
    ids = np.random.default_rng(0).integers(0, PUBLIC_MODEL["config"]["vocab_size"], (2, PROMPT))
    lengths = adapter.run_generate(model, ids, NEW, None, use_cache, 0)["forward_lengths"]
    assert "forward" not in vars(model)  # put back as it was
    assert vars(type(model))["forward"] is forward
    return lengths


@pytest.mark.parametrize("layout", ["reference", *VARIANTS])
def test_every_correct_variant_feeds_its_prompt_once_then_one_token(layout: str) -> None:
    """The class-level variant reaches forward through its class (prefill and decode) and
    its cache-free path calls forward again inside forward: each call is counted once."""
    root = SOLUTION if layout == "reference" else VARIANTS[layout].materialise()
    try:
        assert recorded(root, None) == [PROMPT] + [1] * (NEW - 1)
        assert recorded(root, False) == list(range(PROMPT, PROMPT + NEW))
    finally:
        if root != SOLUTION:
            shutil.rmtree(root, ignore_errors=True)


def test_a_generate_that_starts_over_is_recorded_through_the_class(tmp_path: Path) -> None:
    """Reaching forward through the class hides nothing: a prefill every 2nd step shows."""
    edits = [*VARIANTS["generate_calls_forward_through_the_class"].edits, *every_kth_step(2)]
    root = patched_solution(tmp_path / "sub", FILE, edits)
    assert recorded(root, None) == [PROMPT, 1, PROMPT + 2, 1, PROMPT + 4]


class Twice(nn.Module):
    """forward by every route: the instance, the class, a nested call."""

    def forward(self, ids: torch.Tensor, past_kv: Any = None, use_cache: bool = False) -> Any:
        if not use_cache:
            return self.forward(ids, past_kv, True)  # nested: part of this call
        return ids

    def generate(self, ids: torch.Tensor) -> None:
        self(ids)
        self.forward(ids[:, :1])
        type(self).forward(self, ids[:, :2], None, True)
        Twice.forward(self, ids=ids[:, :3])


def test_every_route_to_forward_counts_once_and_other_instances_pass_through() -> None:
    model, other, forward = Twice(), Twice(), vars(Twice)["forward"]
    ids = torch.zeros(1, 4, dtype=torch.long)
    with forward_calls(model) as lengths:
        model.generate(ids)
        other(ids)  # another instance of the class: not this model's call
    assert lengths == [4, 1, 2, 3]
    assert vars(Twice)["forward"] is forward


def test_forward_kept_on_the_instance_is_counted_and_put_back() -> None:
    model = Twice()
    own = model.forward
    model.forward = own  # an instance attribute (a wrapped or compiled forward, say)
    with forward_calls(model) as lengths:
        model(torch.zeros(2, 3, dtype=torch.long))
    assert lengths == [3]
    assert vars(model)["forward"] is own


def test_forward_is_put_back_when_generate_raises() -> None:
    model, forward = Twice(), vars(Twice)["forward"]
    with pytest.raises(RuntimeError), forward_calls(model):
        assert vars(Twice)["forward"] is not forward  # replaced while generate runs
        raise RuntimeError("generate failed")
    assert vars(Twice)["forward"] is forward


@pytest.mark.parametrize(
    ("args", "kwargs", "tokens"),
    [
        ((torch.zeros(2, 5),), {}, 5),  # positional, the course's way
        ((), {"input_ids": torch.zeros(2, 4)}, 4),
        ((), {"past_kv": torch.zeros(1, 9, 3), "idx": torch.zeros(1, 3, dtype=torch.long)}, 3),
        ((), {}, -1),  # nothing with a shape
        (("text",), {}, -1),
    ],
)
def test_the_tokens_a_call_received(args: tuple, kwargs: dict, tokens: int) -> None:
    assert tokens_given(args, kwargs) == tokens


def test_generate_runs_as_the_students_own_script_runs_it() -> None:
    """The harness adds no context of its own around generate: autograd is on inside it
    unless the submission turns it off, so the timed runs cost what the student's code
    costs (a generate without the skeleton's no_grad pays for autograd)."""
    seen: list[bool] = []

    class Model(nn.Module):
        def forward(self, input_ids: Any, past_kv: Any = None, use_cache: bool = False) -> Any:
            return torch.zeros(*input_ids.shape, 3), past_kv

        def generate(self, input_ids: Any, max_new_tokens: int, **kw: Any) -> Any:
            seen.append(torch.is_grad_enabled())
            self(input_ids)
            return torch.cat([input_ids, input_ids[:, :max_new_tokens]], dim=1)

    with torch.enable_grad():
        adapter.run_generate(Model(), np.zeros((1, 4), np.int64), 2, None, None, 0)
    assert seen == [True]
