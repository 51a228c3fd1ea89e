"""Check 2.11's cache-read probe on every honest cache layout and on caches that are not
read at every step: the worker's half (``adapter.cache_read_effect``) on the public model,
in this process, and the grader's verdict on its figure (``timed.cache_read_verdict``).

Part 2's cache is what forward hands back as past_kv, but a model may read another copy
of it, so the probe scrambles both, in place: what forward handed back, and every key- or
value-shaped tensor the model keeps that the prefill wrote (on a layer, in a buffer, a
dict, a closure or a module-level list), and steps on, feeding back what each call
returns. Every layout of the mutant library's correct variants must be seen reading its
cache; a forward that runs the whole sequence again every few calls (its calls one token
each, like a cache's) must be named at any period up to 64, whatever it keeps and hands
back; a cache with nothing shaped like keys or values is left to the other checks, and
the weights are never written. Which tensors count as keys or values
(``adapter_cache.kv_tensors``) is tested at the end.
"""

from __future__ import annotations

import functools
import math
import shutil
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from grader.parts.part2 import adapter
from grader.parts.part2.build import load
from grader.parts.part2.cases import PUBLIC_MODEL
from grader.parts.part2.timed import (
    CACHE_READ_MIN_EFFECT,
    CACHE_READ_PREFIX,
    CACHE_READ_ROWS,
    CACHE_READ_STEPS,
    cache_read_verdict,
)
from grader.ta.mutants import load_mutants
from grader.ta.regen import import_path, one_thread
from tests.conftest import SOLUTION, grade_checks, patched_solution
from tests.grading.test_partial_caches import (
    LAYER_INPUT_CACHE,
    PART2_LIMITS,
    refreshed_in_forward,
)

# The adapters import the worker's modules flat, as in the sandbox.
pytestmark = pytest.mark.usefixtures("worker_modules_importable")

FILE = "transformer_skeleton.py"
FORWARD_HEAD = "    def forward(\n        self,\n        input_ids: torch.Tensor,\n"
CONFIG = PUBLIC_MODEL["config"]
WIDTH = CONFIG["d_model"]
#: Every correct variant, each cache layout among them (preallocated, copied at every
#: call, held on the layers) and the float64 model.
VARIANTS = {v.name: v for v in load_mutants("part2", variants=True)}


@pytest.fixture(autouse=True)
def torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    """The probe's rows: a prefill and its single-token steps, as the grader sends them."""
    shape = (CACHE_READ_ROWS, CACHE_READ_PREFIX + CACHE_READ_STEPS)
    assert shape[1] <= CONFIG["max_seq_len"]  # the public model has room for every step
    return np.random.default_rng(0).integers(0, CONFIG["vocab_size"], shape)


def effect_of(root: Path, ids: np.ndarray, weights_kept: bool = False) -> float | None:
    """The probe's figure for ``root``'s transformer_skeleton.py on the public model, with
    ``root`` on the import path as the submission's folder is in the sandbox (a helper
    module beside the model file); ``weights_kept``: assert the probe wrote no weight."""
    sys.path.insert(0, str(root))
    try:
        module = import_path(root / FILE, f"part2_cache_read_{abs(hash(root))}")
        model = load(module, PUBLIC_MODEL)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        effect = adapter.cache_read_effect(model, ids, CACHE_READ_PREFIX, WIDTH)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("kv_store", None)
    if weights_kept:
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    return effect


@pytest.mark.parametrize("layout", ["reference", *VARIANTS])
def test_every_correct_variant_reads_its_cache(layout: str, ids: np.ndarray) -> None:
    """The library's layouts include caches six containers deep, in a helper module's
    globals, in an lru_cache and in a decorator's closure, each handed back as a copy:
    each is found and scrambled, and no weight is written."""
    if layout == "reference":
        effect = effect_of(SOLUTION, ids, weights_kept=True)
    else:
        root = VARIANTS[layout].materialise()
        try:
            effect = effect_of(root, ids, weights_kept=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    assert effect is not None and effect > 100 * CACHE_READ_MIN_EFFECT
    assert cache_read_verdict(effect, CACHE_READ_PREFIX) == ""


@pytest.mark.parametrize("period", [4, 8, 32, 64])
def test_a_forward_that_refreshes_its_cache_every_few_calls_is_named(
    tmp_path: Path, ids: np.ndarray, period: int
) -> None:
    """Its calls are one token each and its cache holds the right keys and values, but the
    scrambled cache is clean again by the probe's last step."""
    root = patched_solution(tmp_path / "sub", FILE, refreshed_in_forward(period))
    effect = effect_of(root, ids)
    assert effect is not None and effect <= CACHE_READ_MIN_EFFECT
    assert "forward does not read its cache" in cache_read_verdict(effect, CACHE_READ_PREFIX)


def test_a_forward_under_inference_mode_is_probed_too(tmp_path: Path, ids: np.ndarray) -> None:
    """Decorated with ``torch.inference_mode()``, forward hands back inference tensors,
    which only that mode may write: the reference is still seen reading them, and a
    refresh every 8th call is still named."""
    decorated = "    @torch.inference_mode()\n"
    honest = [(FORWARD_HEAD, decorated + FORWARD_HEAD)]
    root = patched_solution(tmp_path / "honest", FILE, honest)
    assert cache_read_verdict(effect_of(root, ids), CACHE_READ_PREFIX) == ""
    wrapper = "    def forward(self, input_ids"
    refreshed = [(a, b.replace(wrapper, decorated + wrapper)) for a, b in refreshed_in_forward(8)]
    root = patched_solution(tmp_path / "refreshed", FILE, refreshed)
    verdict = cache_read_verdict(effect_of(root, ids), CACHE_READ_PREFIX)
    assert "forward does not read its cache" in verdict


def test_a_cache_of_layer_inputs_is_read(tmp_path: Path, ids: np.ndarray) -> None:
    """Keys projected again from kept inputs do read them: 2.11's look at what the cache
    holds names that design, not this probe."""
    root = patched_solution(tmp_path / "sub", FILE, LAYER_INPUT_CACHE)
    assert cache_read_verdict(effect_of(root, ids), CACHE_READ_PREFIX) == ""


# The layer keeps its inputs in a helper module of the submission's own (kv_store.py) and
# projects every position's keys and values again from them at every step: what forward
# hands back is the right cache, but the next step never reads it.
INPUTS_IN_A_HELPER_MODULE = [
    (
        "import torch.nn.functional as F  # F.softmax, F.relu\n",
        "import torch.nn.functional as F  # F.softmax, F.relu\n\nimport kv_store\n",
    ),
    (
        """        k = self.W_k(x)  # (B, T_new, D)
        v = self.W_v(x)  # (B, T_new, D)
        if use_cache and past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=1)  # (B, T_total, D)
            v = torch.cat([past_kv[1], v], dim=1)  # (B, T_total, D)
""",
        """        seen = x
        if use_cache:  # the layer's inputs so far, kept in the helper module
            if past_kv is not None:
                seen = torch.cat([kv_store.INPUTS[id(self)], x], dim=1)
            kv_store.INPUTS[id(self)] = seen
        k = self.W_k(seen)  # every position projected again, every step
        v = self.W_v(seen)
""",
    ),
]


def inputs_in_a_helper_module(root: Path) -> Path:
    """The reference under ``root`` rewritten as :data:`INPUTS_IN_A_HELPER_MODULE`."""
    root = patched_solution(root, FILE, INPUTS_IN_A_HELPER_MODULE)
    (root / "kv_store.py").write_text("INPUTS: dict = {}  # each layer's inputs, by its id\n")
    return root


def test_inputs_kept_in_a_helper_module_are_not_taken_for_its_cache(
    tmp_path: Path, ids: np.ndarray
) -> None:
    """The kept inputs are shaped like keys and written by the prefill, but they are what
    W_k and W_v were given: not scrambled, so the copy of the cache it hands back, which it
    never reads, is all the probe writes."""
    effect = effect_of(inputs_in_a_helper_module(tmp_path / "sub"), ids, weights_kept=True)
    assert effect == 0.0
    assert "forward does not read its cache" in cache_read_verdict(effect, CACHE_READ_PREFIX)


def test_inputs_kept_in_a_helper_module_lose_2_11(tmp_path: Path) -> None:
    """Graded: its cache holds the right keys and values (2.11's first look passes), its
    calls are one token each; 2.11 names a forward that does not read its cache."""
    root = inputs_in_a_helper_module(tmp_path / "sub")
    graded = grade_checks(root, tmp_path / "out", "part2", {"2.11"}, PART2_LIMITS)
    assert graded.score("2.11") == 0
    assert "forward does not read its cache" in graded.output("2.11")


#: Where :class:`Kept` keeps its cache: a module-level list is one of the places, a weak
#: dictionary by layer another, a function's lru_cache a third.
MODULE_CACHE: list[torch.Tensor] = []
BY_LAYER: Any = weakref.WeakKeyDictionary()


@functools.cache
def layer_store(layer_id: int) -> dict[str, torch.Tensor]:
    return {}


def remembered(method: Any) -> Any:
    """A decorator keeping what the method returns in its closure (on the class)."""
    kept: dict[int, torch.Tensor] = {}

    @functools.wraps(method)
    def wrapper(self: Any, cache: torch.Tensor | None = None) -> torch.Tensor:
        if cache is not None:
            kept[id(self)] = method(self, cache)
        return kept[id(self)]

    return wrapper


class Kept(nn.Module):
    """A model that keeps its cache (B, T, D) in one place an honest design may keep it
    (``where``) and hands the caller a copy. Its logits are a sum over the cache it keeps
    (``reads``), or over the new tokens alone: a cache-free model whose copy is of
    something it never reads. ``table`` adds a fixed float buffer shaped like keys, read at
    every step and never written."""

    def __init__(self, where: str, reads: bool = True, table: bool = False) -> None:
        super().__init__()
        self.where, self.reads = where, reads
        self.layer = nn.Module()  # the cache sits on a submodule, as on an attention layer
        store: dict[str, torch.Tensor] = {}
        self.layer.store = lambda: store  # a closure: the cache is in what it captured
        self.register_buffer("table", torch.ones(1, 128, WIDTH) if table else None)

    @remembered
    def remember(self, cache: torch.Tensor) -> torch.Tensor:
        return cache

    def put(self, cache: torch.Tensor) -> None:
        if self.where == "deep":  # six containers deep: a dataclass-like object in a list
            self.layer.state = [SimpleNamespace(tables={"layers": [[{"k": cache}]]})]
        elif self.where == "weak dict":
            BY_LAYER[self.layer] = {"k": cache}
        elif self.where == "lru cache":
            layer_store(id(self))["k"] = cache
        elif self.where == "decorator closure":
            self.remember(cache)
        elif self.where == "buffer":
            self.layer.register_buffer("cache", cache, persistent=False)
        elif self.where == "dict":
            self.layer.cache = {"k": cache, "v": cache}
        elif self.where == "closure":
            self.layer.store()["k"] = cache
        elif self.where == "module global":
            MODULE_CACHE[:] = [cache]
        else:
            self.layer.cache = cache

    def kept(self) -> torch.Tensor:
        if self.where == "deep":
            return self.layer.state[0].tables["layers"][0][0]["k"]
        if self.where == "weak dict":
            return BY_LAYER[self.layer]["k"]
        if self.where == "lru cache":
            return layer_store(id(self))["k"]
        if self.where == "decorator closure":
            return self.remember()
        if self.where == "dict":
            return self.layer.cache["k"]
        if self.where == "closure":
            return self.layer.store()["k"]
        return MODULE_CACHE[0] if self.where == "module global" else self.layer.cache

    def forward(
        self, input_ids: torch.Tensor, past_kv: Any = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, Any]:
        x = (input_ids.float() / 1000).unsqueeze(-1).expand(-1, -1, WIDTH)  # (B, T_new, D)
        cache = x.clone() if past_kv is None else torch.cat([self.kept(), x], dim=1)
        self.put(cache)
        total = cache.sum() if self.reads else x.sum()
        if self.table is not None:
            total = total + self.table.sum()
        logits = torch.zeros(*input_ids.shape, 8) + total
        return logits, [(cache.clone(), cache.clone())]  # a copy, never read back


#: Every place :class:`Kept` may keep its cache.
PLACES = ["attribute", "buffer", "dict", "closure", "module global", "deep", "weak dict",
          "lru cache", "decorator closure"]  # fmt: skip


@pytest.mark.parametrize("where", PLACES)
def test_a_cache_kept_by_the_model_and_handed_back_as_a_copy_is_read(
    ids: np.ndarray, where: str
) -> None:
    """Noise in the copy changes nothing; noise in the tensors the model keeps (written by
    the prefill) reaches the last step."""
    try:
        effect = adapter.cache_read_effect(Kept(where), ids, CACHE_READ_PREFIX, WIDTH)
    finally:
        MODULE_CACHE.clear()
    assert effect is not None and effect > 100 * CACHE_READ_MIN_EFFECT
    assert cache_read_verdict(effect, CACHE_READ_PREFIX) == ""


@pytest.mark.parametrize("where", PLACES)
def test_a_cache_kept_anywhere_but_never_read_is_named(ids: np.ndarray, where: str) -> None:
    """Found wherever it is kept, the cache is scrambled; a model that reads neither it
    nor its copy shows no change."""
    try:
        effect = adapter.cache_read_effect(Kept(where, False), ids, CACHE_READ_PREFIX, WIDTH)
    finally:
        MODULE_CACHE.clear()
    assert effect == 0.0
    assert "forward does not read its cache" in cache_read_verdict(effect, CACHE_READ_PREFIX)


@pytest.mark.parametrize("table", [False, True])
def test_a_model_that_reads_no_cache_is_named_whatever_it_keeps(
    ids: np.ndarray, table: bool
) -> None:
    """It keeps a cache shaped like one and hands back a copy of it, but reads neither; a
    fixed table it reads at every step is not what the prefill wrote, so it is not
    scrambled (that would pass any forward) and comes through untouched."""
    model = Kept("attribute", reads=False, table=table)
    effect = adapter.cache_read_effect(model, ids, CACHE_READ_PREFIX, WIDTH)
    assert effect == 0.0
    assert "forward does not read its cache" in cache_read_verdict(effect, CACHE_READ_PREFIX)
    assert model.table is None or bool((model.table == 1).all())


def test_a_layer_cache_handed_back_as_a_copy_and_refreshed_every_few_calls_is_named(
    tmp_path: Path, ids: np.ndarray
) -> None:
    """The layers keep their cache and hand back copies (a correct variant's layout), but
    forward runs the whole sequence again every 8th call: scrambled layers heal too."""
    edits = [*VARIANTS["layer_cache_returned_as_copy"].edits, *refreshed_in_forward(8)]
    root = patched_solution(tmp_path / "sub", FILE, edits)
    effect = effect_of(root, ids)
    assert effect is not None and effect <= CACHE_READ_MIN_EFFECT
    assert "forward does not read its cache" in cache_read_verdict(effect, CACHE_READ_PREFIX)


def test_the_weights_are_never_scrambled(ids: np.ndarray) -> None:
    """A transposed weight the model keeps for speed is shaped like keys (D, D), but it is
    the model's memory, not what the prefill wrote: the weights come through unchanged."""
    module = import_path(SOLUTION / FILE, "part2_cache_read_weights")
    model = load(module, PUBLIC_MODEL)
    model.kept_weight = model.layers[0].attention.W_k.weight.t()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    effect = adapter.cache_read_effect(model, ids, CACHE_READ_PREFIX, WIDTH)
    assert cache_read_verdict(effect, CACHE_READ_PREFIX) == ""
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


class Fake(nn.Module):
    """A model whose cache is ``hand_back(past)``: logits from a sum over what it holds
    (``nan`` when it holds anything but zeros, where ``nan_when_scrambled``). It keeps its
    memory flat, (B, T * D), a shape no key or value has, so only what it hands back (a
    view of that memory, or a copy) can be found and scrambled."""

    def __init__(self, hand_back: Any = None, nan_when_scrambled: bool = False) -> None:
        super().__init__()
        self.hand_back, self.nan_when_scrambled = hand_back, nan_when_scrambled
        self.flat: torch.Tensor | None = None

    def forward(
        self, input_ids: torch.Tensor, past_kv: Any = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, Any]:
        rows, new = input_ids.shape
        if past_kv is None:
            self.flat = torch.zeros(rows, 0)
        assert self.flat is not None
        self.flat = torch.cat([self.flat, torch.zeros(rows, new * WIDTH)], dim=1)
        logits = torch.zeros(rows, new, 8) + self.flat.sum()
        if self.nan_when_scrambled and bool(self.flat.abs().sum() > 0):
            logits = logits * math.nan
        held = self.flat.view(rows, -1, WIDTH)  # (B, T, D), the flat memory's view
        return logits, self.hand_back(held) if self.hand_back else None


@pytest.mark.parametrize(
    "hand_back",
    [
        None,  # no cache handed back
        lambda held: [(held[:, :2], held[:, :2])],  # fewer positions than the prefill
        lambda held: [(held.long(), held.long())],  # integers: not keys or values
        lambda held: [(held.expand(3, -1, -1),) * 2],  # not writable in place
    ],
)
def test_without_a_writable_key_or_value_the_other_checks_judge(
    ids: np.ndarray, hand_back: Any
) -> None:
    effect = adapter.cache_read_effect(Fake(hand_back), ids[:1], CACHE_READ_PREFIX, WIDTH)
    assert effect is None
    assert cache_read_verdict(effect, CACHE_READ_PREFIX) == ""


def test_a_scrambled_cache_that_gives_nan_is_read(ids: np.ndarray) -> None:
    model = Fake(lambda held: [(held, held)], nan_when_scrambled=True)
    effect = adapter.cache_read_effect(model, ids, CACHE_READ_PREFIX, WIDTH)
    assert effect == math.inf
    assert cache_read_verdict(effect, CACHE_READ_PREFIX) == ""


@pytest.mark.parametrize(
    ("effect", "named"),
    [(None, False), ("8.0", False), (True, False), (8.0, False), (math.inf, False),
     (0.0, True), (CACHE_READ_MIN_EFFECT, True), (math.nan, True)],
)  # fmt: skip
def test_the_verdict_passes_only_a_clear_change(effect: Any, named: bool) -> None:
    verdict = cache_read_verdict(effect, CACHE_READ_PREFIX)
    assert bool(verdict) == named
    if isinstance(effect, float) and math.isnan(effect):
        assert "NaN" in verdict


# ------------------------------------------------------------ what counts as keys or values


@pytest.mark.parametrize(
    ("shape", "dtype", "found"),
    [
        ((2, 16, WIDTH), torch.float32, True),  # the course's (B, T_total, D)
        ((2, 64, WIDTH), torch.float64, True),  # a preallocated buffer, float64
        ((2, WIDTH, 16), torch.float32, True),  # keys held transposed, (B, D, T)
        ((2, 3, 2, 16, WIDTH), torch.float32, True),  # stacked (layers, 2, B, T, D)
        ((2, 15, WIDTH), torch.float32, False),  # fewer positions than the prefill
        ((2, 16, 7), torch.float32, False),  # another width
        ((2, 16), torch.float32, False),  # no feature axis
        ((2, 16, WIDTH), torch.int64, False),  # integers
        ((2, 16, WIDTH), torch.bool, False),  # a mask
    ],
)
def test_what_counts_as_keys_or_values(
    shape: tuple[int, ...], dtype: torch.dtype, found: bool
) -> None:
    tensor = torch.zeros(shape, dtype=dtype)
    assert bool(adapter.kv_tensors(tensor, 16, WIDTH)) is found


def test_keys_and_values_are_found_in_lists_tuples_dicts_and_objects() -> None:
    class Pair:
        def __init__(self) -> None:
            self.k, self.v = torch.zeros(1, 4, WIDTH), torch.zeros(1, 4, WIDTH)

    k = torch.zeros(1, 4, WIDTH)
    past = [(k, k), {"k": torch.zeros(1, 4, WIDTH)}, Pair(), None, "text"]
    assert len(adapter.kv_tensors(past, 4, WIDTH)) == 4  # k, held twice, is found once
    deep: Any = torch.zeros(1, 4, WIDTH)
    for _ in range(8):  # deeper than any fixed bound the search once had
        deep = [deep]
    assert len(adapter.kv_tensors(deep, 4, WIDTH)) == 1


def test_a_weight_handed_back_is_never_a_cache() -> None:
    """A transposed weight handed back with the cache shares the model's memory: never
    scrambled, wherever it sits."""
    model = nn.Linear(WIDTH, WIDTH, bias=False)
    past = [(model.weight.t(), torch.zeros(1, WIDTH, WIDTH))]
    found = adapter.kv_tensors(past, 4, WIDTH, model)
    assert len(found) == 1 and found[0] is past[0][1]
