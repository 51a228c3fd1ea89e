"""Check 2.11's look at what the cache holds, on every honest cache layout and on a cache of
layer inputs: the worker's half (``adapter.run_cache_values``) on the public model, in this
process, and the grader's comparison with the reference's keys and values
(``timed.cache_contents_problem``), and of the cache's width beside the model's
(``timed.cache_dtype_problem``).

Part 2's cache is what forward hands back as past_kv, so where a submission keeps it (grown
with torch.cat, preallocated on first use or with the model, copied at every call, held on
the layers) must not matter; a cache from which every step projects the keys again must
be named.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from grader.core.paths import TEST_CASES
from grader.parts.part2 import adapter
from grader.parts.part2.build import load
from grader.parts.part2.cases import PUBLIC_MODEL
from grader.parts.part2.timed import cache_contents_problem, cache_dtype_problem
from grader.ta.mutants import load_mutants
from grader.ta.regen import import_path, one_thread
from tests.conftest import SOLUTION, patched_solution
from tests.grading.test_partial_caches import FLOAT64_CACHE, LAYER_INPUT_CACHE

FILE = "transformer_skeleton.py"
#: The correct variants that keep their cache in another way than the reference.
LAYOUTS = ["preallocated_cache", "cloned_cache_per_step", "eager_cache_on_layers"]
VARIANTS = {v.name: v for v in load_mutants("part2", variants=True)}


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """The hidden cases' cache probe: prompt, forward calls, the reference's K and V."""
    return json.loads((TEST_CASES / "hidden" / "part2.json").read_text())["cache_values"]


@pytest.fixture(scope="module")
def atol() -> float:
    return float(json.loads((TEST_CASES / "public" / "part2.json").read_text())["atol"])


@pytest.fixture(autouse=True)
def torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


def problem_of(root: Path, probe: dict[str, Any], atol: float) -> str:
    """What 2.11 says of the cache of ``root``'s transformer_skeleton.py."""
    module = import_path(root / FILE, f"part2_cache_layout_{abs(hash(root))}")
    model = load(module, PUBLIC_MODEL)
    ids = np.asarray(probe["input_ids"], dtype=np.int64)
    result = adapter.run_cache_values(model, ids, probe["steps"])
    return cache_contents_problem(probe, result["arrays"], atol) or cache_dtype_problem(
        result["dtypes"]
    )


@pytest.mark.parametrize("layout", ["reference", *LAYOUTS, "float64_model"])
def test_every_honest_cache_layout_holds_the_keys_and_values(
    layout: str, probe: dict[str, Any], atol: float
) -> None:
    if layout == "reference":
        assert problem_of(SOLUTION, probe, atol) == ""
        return
    root = VARIANTS[layout].materialise()
    try:
        assert problem_of(root, probe, atol) == ""
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_cache_of_layer_inputs_is_named(
    tmp_path: Path, probe: dict[str, Any], atol: float
) -> None:
    root = patched_solution(tmp_path / "sub", FILE, LAYER_INPUT_CACHE)
    assert "does not hold the keys of the tokens seen" in problem_of(root, probe, atol)


def test_nan_never_passes(probe: dict[str, Any], atol: float) -> None:
    arrays = {}
    for i, (k, v) in enumerate(zip(probe["k"], probe["v"], strict=True)):
        arrays[f"k{i}"] = np.full(k["shape"], np.nan, np.float32)
        arrays[f"v{i}"] = np.full(v["shape"], np.nan, np.float32)
    assert "does not hold the keys" in cache_contents_problem(probe, arrays, atol)


def test_a_float64_cache_beside_float32_weights_is_named(
    tmp_path: Path, probe: dict[str, Any], atol: float
) -> None:
    root = patched_solution(tmp_path / "sub", FILE, FLOAT64_CACHE)
    problem = problem_of(root, probe, atol)
    assert "holds float64 tensors where the model's weights are float32" in problem
    assert "2x the memory" in problem


@pytest.mark.parametrize(
    ("dtypes", "named"),
    [
        ({"cache": ["float64"], "model": ["float32"]}, True),
        ({"cache": ["float32", "float64"], "model": ["float32"]}, True),
        ({"cache": ["float32"], "model": ["float16"]}, True),
        ({"cache": ["float64"], "model": ["float64"]}, False),
        ({"cache": ["float32"], "model": ["float32"]}, False),
        ({"cache": ["bfloat16"], "model": ["float32"]}, False),
        ({"cache": ["float64"], "model": []}, False),  # nothing to judge against
        ({"cache": "float64", "model": ["float32"]}, False),  # malformed: not judged
        (None, False),
    ],
)
def test_the_cache_width_is_judged_against_the_weights(dtypes: Any, named: bool) -> None:
    assert bool(cache_dtype_problem(dtypes)) is named
