"""Check 3.11's cache-read probe on every honest cache layout and on caches that are not
read: the worker's half (``adapter.cache_read_effect``) on the tiny checkpoint, in this
process, and the grader's verdict on its figure (``timed.cache_read_verdict``).

Every layout of the mutant library's correct variants must be seen reading its cache
(the reference's cache allocated on first use, Meta's allocated in ``__init__``, one grown
with ``torch.cat``, one copied at every step, per-layer pairs handed through the layers);
a cache that is written but never read must be named, and a model with no cache tensor at
all is left to the other probes. Where the worker looks for a cache
(``adapter_cache.cache_tensors``) is tested on small modules at the end.
"""

from __future__ import annotations

import math
import shutil
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from grader.core.paths import TEST_CASES
from grader.parts.part3 import adapter, adapter_cache, adapter_load
from grader.parts.part3.build import import_llama
from grader.parts.part3.timed import (
    CACHE_READ_MIN_EFFECT,
    CACHE_READ_STEPS,
    cache_read_verdict,
    layer_read_verdict,
)
from grader.ta.mutants import load_mutants
from grader.ta.regen import one_thread
from tests.conftest import SOLUTION, grade_checks, patched_solution
from tests.grading.test_partial_caches import (
    LLAMA_LAYER_INPUTS,
    PART3_LIMITS,
    llama_refreshed_in_forward,
)

# The adapters import the worker's modules flat, as in the sandbox.
pytestmark = pytest.mark.usefixtures("worker_modules_importable")

CKPT = TEST_CASES / "public" / "part3" / "tiny_llama"
PARAMS = {"n_heads": 4, "n_kv_heads": 2, "dim": 64}  # the tiny checkpoint's params.json
HEADS = (PARAMS["n_kv_heads"], PARAMS["n_heads"])
HEAD_DIM = PARAMS["dim"] // PARAMS["n_heads"]
PREFIX = 9

#: The correct variants that keep their cache in another way than the reference: Meta's
#: preallocated, grown with torch.cat, copied at every step, handed through the layers; in
#: a closure made at prefill time, a helper module's globals, an nn.ParameterList made at
#: prefill time, a deque the layers turn.
LAYOUTS = ["eager_cache", "cat_grown_cache", "cloned_cache_per_step", "cache_passed_through_layers",
           "cache_in_closure", "cache_in_helper_module", "cache_in_parameter_list",
           "cache_in_rotating_deque", "cache_as_chunk_list"]  # fmt: skip
VARIANTS = {v.name: v for v in load_mutants("part3", variants=True)}

#: Keys and values projected again, at every step, from the layer inputs the layer keeps
#: (unindented: each design places it).
REPROJECTED = """\
if start_pos == 0:
    self.seen_x, self.seen_f = x, freqs_cis
else:
    self.seen_x = torch.cat([self.seen_x[:bsz, :start_pos], x], dim=1)
    self.seen_f = torch.cat([self.seen_f[:start_pos], freqs_cis], dim=0)
shape = (bsz, start_pos + seqlen, self.n_kv_heads, self.head_dim)
every = self.wk(self.seen_x).view(shape)
_, keys = apply_rotary_emb(every, every, freqs_cis=self.seen_f)
values = self.wv(self.seen_x).view(shape)
"""

# Keys and values projected again at every step from the layer inputs kept on the layer:
# no tensor shaped like a cache anywhere, so the probe has nothing to scramble.
NO_CACHE_TENSOR = [
    (
        """            if self.cache_k is None or self.cache_k.shape != self._cache_shape():
                self.cache_k = torch.zeros(self._cache_shape(), dtype=xk.dtype, device=xk.device)
                self.cache_v = torch.zeros(self._cache_shape(), dtype=xv.dtype, device=xv.device)
            self.cache_k = self.cache_k.to(xk)
            self.cache_v = self.cache_v.to(xv)
            self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
            self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)
            values = self.cache_v[:bsz, : start_pos + seqlen]
""",
        textwrap.indent(REPROJECTED, " " * 12),
    )
]


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    """One row of ``PREFIX`` prompt tokens and the probe's steps, as the grader sends."""
    return np.random.default_rng(0).integers(0, 4096, (1, PREFIX + CACHE_READ_STEPS))


@pytest.fixture
def torch_one_thread() -> Iterator[None]:
    with one_thread():
        yield


def built(root: Path) -> Any:
    """The ``llama`` package under ``root``, built with the cache on from the tiny
    checkpoint as the grader builds the public model."""
    settings = {
        "ckpt_dir": str(CKPT),
        "tokenizer_path": str(CKPT / "tokenizer.model"),
        "max_seq_len": 128,  # the public model's, as the grader builds it
        "max_batch_size": 2,
        "kv_caching": True,
        "device": "cpu",
    }
    model, _ = adapter_load.build_from_checkpoint(import_llama(root), settings)
    return model


def effect_of(root: Path, tokens: np.ndarray, sizes: bool = True) -> float | None:
    """The probe's figure for the ``llama`` package under ``root`` (:func:`built`);
    ``sizes``: the grader sends the head sizes, as it does."""
    model = built(root)
    if not sizes:
        return adapter.cache_read_effect(model, tokens, PREFIX, steps=CACHE_READ_STEPS)
    return adapter.cache_read_effect(model, tokens, PREFIX, HEADS, HEAD_DIM, CACHE_READ_STEPS)


def variant_effect(name: str, tokens: np.ndarray, sizes: bool = True) -> float | None:
    """:func:`effect_of` the correct variant ``name`` of the mutant library."""
    root = VARIANTS[name].materialise()
    try:
        return effect_of(root, tokens, sizes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("layout", ["reference", *LAYOUTS])
def test_every_honest_cache_layout_is_seen_reading_its_cache(
    layout: str, tokens: np.ndarray
) -> None:
    if layout == "reference":
        effect = effect_of(SOLUTION, tokens)
    else:
        effect = variant_effect(layout, tokens)
    assert effect is not None and effect > CACHE_READ_MIN_EFFECT, effect
    assert cache_read_verdict(effect, PREFIX) == ""


@pytest.mark.usefixtures("torch_one_thread")
def test_a_cache_found_only_by_its_shape_needs_the_head_sizes(tokens: np.ndarray) -> None:
    """The layers' pairs of cache_passed_through_layers have no Meta name: without the
    head sizes nothing is found, and no verdict is given."""
    assert variant_effect("cache_passed_through_layers", tokens, sizes=False) is None


@pytest.mark.usefixtures("torch_one_thread")
def test_a_cache_written_but_never_read_is_named(tmp_path: Path, tokens: np.ndarray) -> None:
    root = patched_solution(tmp_path / "sub", "llama/model.py", LLAMA_LAYER_INPUTS)
    effect = effect_of(root, tokens)
    assert effect is not None and effect <= CACHE_READ_MIN_EFFECT
    assert "does not read its cache" in cache_read_verdict(effect, PREFIX)


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("period", [2, 8, 64])
def test_a_cache_refreshed_every_few_steps_is_named(
    tmp_path: Path, tokens: np.ndarray, period: int
) -> None:
    """A forward that runs the whole prefix again every ``period`` calls (its calls one
    token each, like a cache's) has cleaned the scrambled cache by the probe's last step."""
    root = patched_solution(tmp_path / "sub", "llama/model.py", llama_refreshed_in_forward(period))
    effect = effect_of(root, tokens)
    assert effect is not None and effect <= CACHE_READ_MIN_EFFECT
    assert "does not read its cache" in cache_read_verdict(effect, PREFIX)


@pytest.mark.usefixtures("torch_one_thread")
def test_without_any_cache_tensor_the_other_probes_judge(
    tmp_path: Path, tokens: np.ndarray
) -> None:
    root = patched_solution(tmp_path / "sub", "llama/model.py", NO_CACHE_TENSOR)
    effect = effect_of(root, tokens)
    assert effect is None
    assert cache_read_verdict(effect, PREFIX) == ""


@pytest.mark.parametrize(
    ("effect", "named"),
    [(None, False), ("8.0", False), (True, False), (8.0, False), (math.inf, False),
     (0.0, True), (CACHE_READ_MIN_EFFECT, True), (math.nan, True)],
)  # fmt: skip
def test_the_verdict_passes_only_a_clear_change(effect: Any, named: bool) -> None:
    verdict = cache_read_verdict(effect, PREFIX)
    assert bool(verdict) == named
    if effect is not None and isinstance(effect, float) and math.isnan(effect):
        assert "NaN" in verdict


# ------------------------------------------------------------ where a cache is looked for


@pytest.mark.parametrize(
    ("shape", "named", "like"),
    [
        ((1, 8, 2, 16), False, True),  # (B, T, Hkv, D): Meta's layout
        ((1, 2, 8, 16), False, True),  # (B, Hkv, T, D)
        ((2, 1, 8, 4, 16), False, True),  # stacked (layers, B, T, H, D), every query head
        ((1, 8, 64), False, False),  # a layer's inputs (B, T, dim)
        ((1, 3, 2, 16), False, False),  # fewer positions than the prefill
        ((1, 8, 3, 16), False, False),  # another head count
        ((1, 8, 64), True, True),  # under Meta's names any shape counts
    ],
)
def test_what_looks_like_a_cache(shape: tuple[int, ...], named: bool, like: bool) -> None:
    assert adapter_cache.cache_like(torch.zeros(shape), named, HEADS, HEAD_DIM, 5) is like


def test_masks_are_never_a_cache() -> None:
    assert not adapter_cache.cache_like(
        torch.zeros(1, 8, 2, 16, dtype=torch.bool), True, HEADS, 16, 5
    )


class Slots(nn.Module):
    """A weight shaped like a cache, a transposed view of it kept for speed, and, once
    ``fill`` has run, a parameter list holding a cache (made by the call, as at prefill)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.ones(1, 8, 2, 16))
        self.slots: nn.ParameterList | None = None

    def fill(self, values: torch.Tensor) -> None:
        self.slots = nn.ParameterList([nn.Parameter(values.clone(), requires_grad=False)])
        self.fast = self.table.transpose(1, 2)  # (1, 2, 8, 16): the weight's memory


def test_a_parameter_is_a_cache_only_where_the_prefill_wrote_it() -> None:
    """Parameters are searched (a parameter list may hold the cache) but the weights are
    left out by their memory: by default every parameter's, and in the probe every one
    that existed before the prefill and that it did not write."""
    model = Slots()
    model.fill(torch.zeros(1, 8, 2, 16))
    assert adapter_cache.cache_tensors(model, 5, HEADS, HEAD_DIM) == []  # default: weights
    found = adapter_cache.written_by(
        model, lambda: model.fill(torch.randn(1, 8, 2, 16)), 5, HEADS, HEAD_DIM
    )
    assert [t for ts in found.values() for t in ts] == [model.slots[0]]
    assert bool((model.table == 1).all())


def test_a_table_the_prefill_did_not_write_is_not_scrambled() -> None:
    """A fixed buffer shaped like a cache that every call reads is not what the prefill
    wrote: scrambling it would change the logits of any forward, cache or no cache."""
    model = Layer()
    assert adapter_cache.written_by(model, lambda: None, 5, HEADS, HEAD_DIM) == {}
    assert bool((model.buffered == 0).all())


@dataclass
class Pair:
    k: torch.Tensor
    v: torch.Tensor


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("buffered", torch.zeros(1, 2, 8, 16), persistent=False)
        self.cache_k = torch.zeros(3, 3)  # Meta's name: found whatever its shape
        self.seen_x = torch.zeros(1, 8, 64)  # kept inputs: never found


class Holder(nn.Module):
    """Caches on the layers and per-layer pairs in the model's own containers."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        shared = torch.ones(1, 8, 2, 16)
        self.kv = [(shared, torch.ones(1, 8, 2, 16)), None]
        self.by_layer = {"0": Pair(shared, torch.ones(1, 2, 8, 16))}


def test_caches_are_found_on_layers_and_in_containers_each_once() -> None:
    model = Holder()
    found = adapter_cache.cache_tensors(model, 5, HEADS, HEAD_DIM)
    expected = [model.kv[0][0], model.kv[0][1], model.by_layer["0"].v]
    expected += [t for layer in model.layers for t in (layer.buffered, layer.cache_k)]
    assert sorted(map(id, found)) == sorted(map(id, expected))
    meta_only = {id(layer.cache_k) for layer in model.layers}
    assert {id(t) for t in adapter_cache.cache_tensors(model, 5)} == meta_only


@pytest.mark.usefixtures("torch_one_thread")
def test_a_cache_that_cannot_be_written_gives_no_figure(tmp_path: Path, tokens: np.ndarray) -> None:
    """An expanded view cannot take noise in place: no figure, rather than a wrong one."""
    edit = (
        "            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)\n",
        "            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)\n"
        "            self.spread = torch.zeros(1, 1, self.n_kv_heads, self.head_dim).expand(\n"
        "                bsz, start_pos + seqlen, -1, -1)\n",
    )
    root = patched_solution(tmp_path / "sub", "llama/model.py", [edit])
    assert effect_of(root, tokens) is None


# Every layer writes its keys and values into its cache, but the last layer then attends
# over keys and values projected again from the inputs it kept: the cache holds the right
# entries (what 3.7 and 3.11 look at first) and, scrambled all at once, still moves the
# logits through the other layer; scrambled layer by layer, the last one's moves nothing.
LAYERS_LINE = (
    "        self.layers = nn.ModuleList("
    "TransformerBlock(i, params) for i in range(params.n_layers))\n"
)
LAST_LAYER_REPROJECTS = [
    (
        """            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)
            values = self.cache_v[:bsz, : start_pos + seqlen]
""",
        """            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)
            values = self.cache_v[:bsz, : start_pos + seqlen]
            if getattr(self, "reprojects", False):
"""
        + textwrap.indent(REPROJECTED, " " * 16),
    ),
    (LAYERS_LINE, LAYERS_LINE + "        self.layers[-1].attention.reprojects = True\n"),
]


def effects_of(root: Path, tokens: np.ndarray) -> dict[str | None, float] | None:
    """The probe's figures for ``root`` with every module's cache also scrambled alone."""
    return adapter.cache_read_effect(
        built(root), tokens, PREFIX, HEADS, HEAD_DIM, CACHE_READ_STEPS, per_owner=True
    )


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("layout", ["reference", *LAYOUTS])
def test_every_layer_of_every_honest_layout_reads_its_own_cache(
    layout: str, tokens: np.ndarray
) -> None:
    root = SOLUTION if layout == "reference" else VARIANTS[layout].materialise()
    try:
        effects = effects_of(root, tokens)
    finally:
        if root != SOLUTION:
            shutil.rmtree(root, ignore_errors=True)
    assert effects is not None
    assert layer_read_verdict({k: v for k, v in effects.items() if k is not None}, PREFIX) == ""


@pytest.mark.usefixtures("torch_one_thread")
def test_a_layer_that_writes_its_cache_but_reads_keys_projected_again_is_named(
    tmp_path: Path, tokens: np.ndarray
) -> None:
    root = patched_solution(tmp_path / "sub", "llama/model.py", LAST_LAYER_REPROJECTS)
    effects = effects_of(root, tokens)
    assert effects is not None and effects[None] > CACHE_READ_MIN_EFFECT  # all at once: read
    layers = {k: v for k, v in effects.items() if k is not None}
    assert len(layers) == 2, layers
    verdict = layer_read_verdict(layers, PREFIX)
    assert "the cache held by layers.1.attention is not read" in verdict
    assert "layers.0" not in verdict


def test_an_unused_buffer_beside_the_cache_is_not_judged(tokens: np.ndarray) -> None:
    """Meta's cache_k kept in __init__ but never written (the student's cache lives
    elsewhere) is all zeros after the prefill: it is not a layer whose cache goes unread."""

    class Layer(nn.Module):
        def __init__(self, unused: bool) -> None:
            super().__init__()
            self.cache_k = torch.zeros(1, 128, 2, HEAD_DIM)
            self.used = not unused

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([Layer(False), Layer(True)])

        def forward(self, ids: Any, start: int) -> Any:
            cache = self.layers[0].cache_k
            if start == 0:
                cache[:, : ids.shape[1]] = torch.randn(1, ids.shape[1], 2, HEAD_DIM)
            return (
                cache[:, : start + ids.shape[1]]
                .sum(dim=(1, 2, 3))[:, None, None]
                .expand(1, ids.shape[1], 8)
            )

    effects = adapter.cache_read_effect(
        Model(), tokens[:, : PREFIX + 3], PREFIX, HEADS, HEAD_DIM, 3, per_owner=True
    )
    assert effects is not None and set(effects) == {None}  # one module wrote: judged at once


def test_the_layer_that_reads_keys_projected_again_loses_3_11(tmp_path: Path) -> None:
    """Graded: its logits, cache contents and calls are right; 3.11 names the layer."""
    root = patched_solution(tmp_path / "sub", "llama/model.py", LAST_LAYER_REPROJECTS)
    graded = grade_checks(root, tmp_path / "out", "part3", {"3.3", "3.11"}, PART3_LIMITS)
    assert graded.score("3.3") == graded.test("3.3")["max_score"]  # right logits
    assert graded.score("3.11") == 0
    assert "the cache held by layers.1.attention is not read" in graded.output("3.11")


# A closure made at prefill time keeps the layer's inputs and the cache it writes, and
# attention attends over keys and values projected again from the kept inputs: the cache
# holds the right entries (3.7 and 3.11 look at that first), but no step reads it.
CLOSURE_NOT_READ = [
    (
        "class Attention(nn.Module):",
        '''def layer_keeper():
    """A closure keeping the layer's inputs and the keys and values it is given."""
    held: dict[str, torch.Tensor] = {}

    def keep(x, freqs_cis, xk, xv, start_pos):
        new = {"x": x, "f": freqs_cis, "k": xk, "v": xv}
        if start_pos == 0:
            held.update(new)
        else:
            for name, t in new.items():
                dim = 0 if name == "f" else 1
                old = held[name] if name == "f" else held[name][: x.shape[0]]
                held[name] = torch.cat([old.narrow(dim, 0, start_pos), t], dim=dim)
        return held

    return keep


class Attention(nn.Module):''',
    ),
    (
        NO_CACHE_TENSOR[0][0],
        """            if start_pos == 0 or getattr(self, "keep", None) is None:
                self.keep = layer_keeper()
            held = self.keep(x, freqs_cis, xk, xv, start_pos)
            shape = (bsz, start_pos + seqlen, self.n_kv_heads, self.head_dim)
            every = self.wk(held["x"]).view(shape)
            _, keys = apply_rotary_emb(every, every, freqs_cis=held["f"])
            values = self.wv(held["x"]).view(shape)
""",
    ),
    (
        "                layer.attention.cache_k = layer.attention.cache_v = None",
        "                layer.attention.keep = None",
    ),
]


@pytest.mark.usefixtures("torch_one_thread")
def test_a_cache_kept_in_a_closure_but_never_read_is_named(
    tmp_path: Path, tokens: np.ndarray
) -> None:
    """The closure's keys and values are found (it was made at prefill time) and written
    with noise; the logits do not move, and no weight is written."""
    root = patched_solution(tmp_path / "sub", "llama/model.py", CLOSURE_NOT_READ)
    model = built(root)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    effect = adapter.cache_read_effect(model, tokens, PREFIX, HEADS, HEAD_DIM, CACHE_READ_STEPS)
    assert effect is not None and effect <= CACHE_READ_MIN_EFFECT
    assert "does not read its cache" in cache_read_verdict(effect, PREFIX)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_cache_kept_in_a_closure_but_never_read_loses_3_11(tmp_path: Path) -> None:
    """Graded: its logits and what its cache holds are right; 3.11 names it."""
    root = patched_solution(tmp_path / "sub", "llama/model.py", CLOSURE_NOT_READ)
    graded = grade_checks(root, tmp_path / "out", "part3", {"3.3", "3.11"}, PART3_LIMITS)
    assert graded.score("3.3") == graded.test("3.3")["max_score"]  # right logits
    assert graded.score("3.11") == 0
    assert "attention does not read its cache" in graded.output("3.11")


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("layout", ["reference", *LAYOUTS])
def test_no_honest_layout_has_a_weight_written(layout: str, tokens: np.ndarray) -> None:
    """The probe writes noise into what the prefill wrote, wherever it is kept: never into
    the model's weights (a parameter list that holds the cache is not a weight)."""
    root = SOLUTION if layout == "reference" else VARIANTS[layout].materialise()
    try:
        model = built(root)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        adapter.cache_read_effect(model, tokens, PREFIX, HEADS, HEAD_DIM, CACHE_READ_STEPS)
        held = model.state_dict()
        assert all(torch.equal(held[k], v) for k, v in weights.items())
    finally:
        if root != SOLUTION:
            shutil.rmtree(root, ignore_errors=True)
