"""Checks 3.7 and 3.11's cache-contents probe: the worker's half (``adapter.cache_contents``)
on the tiny checkpoint, in this process, against the reference's keys and values stored
with the hidden cases, and the grader's verdict (``cache_contents``).

Every honest layout of the mutant library's correct variants must be seen holding every
layer's keys and values; a design that keeps a layer's inputs and projects its keys or
values again from them must be named, by layer and by keys or values, and the stored
signatures must name the mistake; a forward whose logits are wrong, or a model that holds
nothing shaped like a cache, is left to the other checks. Seeded, no clock.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grader.core.paths import TEST_CASES
from grader.parts.part3 import adapter, adapter_cache, adapter_load
from grader.parts.part3.build import import_llama
from grader.parts.part3.cache_contents import (
    CACHE_FILE,
    contents_verdict,
    covered,
    dtype_note,
    holds,
    observation,
)
from grader.parts.part3.cases import ATOL
from grader.sandbox.sandbox import Limits
from grader.ta.mutants import load_mutants
from grader.ta.regen import one_thread
from tests.conftest import SOLUTION, patched_solution, run_grade
from tests.grading.test_partial_caches import LLAMA_VALUES_FROM_INPUT_PIECES

# The adapters import the worker's modules flat, as in the sandbox.
pytestmark = pytest.mark.usefixtures("worker_modules_importable")

CKPT = TEST_CASES / "public" / "part3" / "tiny_llama"
HEADS, HEAD_DIM = (2, 4), 16  # the tiny checkpoint's n_kv_heads, n_heads, dim // n_heads
LIBRARY = {m.name: m for m in load_mutants("part3") + load_mutants("part3", variants=True)}
#: The correct variants that keep their cache another way than the reference.
LAYOUTS = ["eager_cache", "cat_grown_cache", "cat_cache_report_style", "cloned_cache_per_step",
           "cache_passed_through_layers", "sdpa_attention", "cache_as_chunk_list"]  # fmt: skip
#: Each partial cache and what it leaves out: [keys or values, layer].
PARTIAL = {
    "values_reprojected_every_layer": [["values", 0], ["values", 1]],
    "keys_reprojected_one_layer": [["keys", 0]],
}


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    """The hidden file's probe: its ids and the reference's values per RoPE convention."""
    return json.loads((TEST_CASES / CACHE_FILE).read_text())


def seen_by(root: Path, probe: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the probe sees of the ``llama`` package under ``root`` (built with the cache on
    from the tiny checkpoint, as the grader builds its public model), and the worker's
    header."""
    settings = {
        "ckpt_dir": str(CKPT),
        "tokenizer_path": str(CKPT / "tokenizer.model"),
        "max_seq_len": 128,
        "max_batch_size": 4,
        "kv_caching": True,
        "device": "cpu",
    }
    with one_thread():
        model, _ = adapter_load.build_from_checkpoint(import_llama(root), settings)
        tokens = np.asarray(probe["tokens"], dtype=np.int64)
        header, arrays = adapter.cache_contents(model, tokens, probe["prefix"], HEADS, HEAD_DIM)
    return observation(probe["expected"]["scaled"], arrays, ATOL), header


def library_seen(name: str, probe: dict[str, Any]) -> dict[str, Any]:
    """:func:`seen_by` the mutant or correct variant ``name`` of the library."""
    root = LIBRARY[name].materialise()
    try:
        return seen_by(root, probe)[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("layout", ["reference", *LAYOUTS])
def test_every_honest_cache_layout_holds_every_layers_keys_and_values(
    layout: str, probe: dict[str, Any]
) -> None:
    seen = seen_by(SOLUTION, probe)[0] if layout == "reference" else library_seen(layout, probe)
    assert seen == {"not_held": []}
    assert contents_verdict(seen, probe["prefix"]) == ""


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_a_partial_cache_is_named_by_layer_and_kind(name: str, probe: dict[str, Any]) -> None:
    seen = library_seen(name, probe)
    assert seen == {"not_held": PARTIAL[name]}
    verdict = contents_verdict(seen, probe["prefix"])
    kind, layer = PARTIAL[name][0]
    assert f"the {kind} of layer" in verdict and f" {layer}" in verdict
    assert "not a KV cache" in verdict


def test_the_stored_signatures_name_each_partial_cache() -> None:
    """``regen`` ran the probe on every mutant: the partial caches' observations are their
    signatures, and no other mistake shares them (the named cause is the right one)."""
    signatures = json.loads((TEST_CASES / "public" / "part3.json").read_text())["signatures"]
    stored = signatures["cache_contents"]
    for name, missing in PARTIAL.items():
        assert stored[name] == {"not_held": missing}
        assert [n for n, sig in stored.items() if sig == {"not_held": missing}] == [name]


def test_the_layer_named_follows_the_layer_left_out(tmp_path: Path, probe: dict[str, Any]) -> None:
    """The keys of the last layer, not the first, projected again: layer 1 is named."""
    mutant = LIBRARY["keys_reprojected_one_layer"]
    edits = [(old, new.replace("layer_id == 0", "layer_id == 1")) for old, new in mutant.edits]
    root = patched_solution(tmp_path / "sub", mutant.file, edits)
    seen = seen_by(root, probe)[0]
    assert seen == {"not_held": [["keys", 1]]}
    assert "the keys of layer 1 " in contents_verdict(seen, probe["prefix"])


def test_a_cache_kept_in_pieces_that_leaves_the_values_out_is_named(
    tmp_path: Path, probe: dict[str, Any]
) -> None:
    """Keys kept as a list of pieces joined when read, values projected again from the
    inputs kept beside them: no tensor holds every position, and the values of every layer
    are named."""
    root = patched_solution(tmp_path / "sub", "llama/model.py", LLAMA_VALUES_FROM_INPUT_PIECES)
    seen = seen_by(root, probe)[0]
    assert seen == {"not_held": [["values", 0], ["values", 1]]}
    assert "the values of layers 0 and 1 " in contents_verdict(seen, probe["prefix"])


def test_wrong_logits_are_left_to_the_checks_of_forward(probe: dict[str, Any]) -> None:
    """RoPE sliced from position 0: the keys differ from the reference's because forward
    is wrong (checks 3.3 to 3.5 say so), not because the cache leaves them out."""
    seen = library_seen("rope_from_zero", probe)
    assert seen == {"logits_differ": True}
    assert contents_verdict(seen, probe["prefix"]) == ""


def test_without_any_cache_tensor_the_other_probes_judge(probe: dict[str, Any]) -> None:
    want = probe["expected"]["scaled"]
    logits = {"logits": np.asarray(_decode(want["logits"]))}
    seen = observation(want, logits, ATOL)
    assert seen == {"nothing_found": True}
    assert contents_verdict(seen, probe["prefix"]) == ""


def _decode(value: Any) -> np.ndarray:
    from grader.core.arrays import decode_array

    return decode_array(value)


# ------------------------------------------------------------ what counts as holding


def _keys(seed: int = 0, rows: int = 2, seen: int = 13) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, seen, 2, HEAD_DIM)).astype(np.float32)


def test_a_preallocated_cache_holds_its_rows_and_positions() -> None:
    want = _keys()
    cache = torch.zeros(4, 128, 2, HEAD_DIM)
    cache[:2, :13] = torch.from_numpy(want)
    held = adapter_cache.seen_positions(cache, HEADS, 13)
    assert held.shape == (4, 13, 2, HEAD_DIM)
    assert holds([held], want, ATOL)


def test_heads_before_positions_and_stacked_layers_are_held() -> None:
    want = _keys()
    transposed = torch.from_numpy(want).transpose(1, 2).contiguous()  # (B, H, T, D)
    assert holds([adapter_cache.seen_positions(transposed, HEADS, 13)], want, ATOL)
    stacked = torch.zeros(3, 2, 2, 20, HEAD_DIM)  # (layers, B, H, T, D), layer 2 the one
    stacked[2, :, :, :13] = transposed
    assert holds([adapter_cache.seen_positions(stacked, HEADS, 13)], want, ATOL)


def test_a_cache_of_every_query_head_holds_the_keys_repeated() -> None:
    want = _keys()
    expanded = np.repeat(want, 2, axis=2)  # as repeat_kv expands them
    assert holds([expanded], want, ATOL)
    assert not holds([np.tile(want, (1, 1, 2, 1))], want, ATOL)  # other heads' order


@pytest.mark.parametrize(
    "got",
    [
        lambda w: w + 0.05,  # other values
        lambda w: w[:, :12],  # one position short
        lambda w: np.where(np.arange(13)[None, :, None, None] == 4, np.nan, w),  # NaN
        lambda w: w[:1],  # fewer rows
        lambda w: w.reshape(2, 13, 1, 32),  # heads merged
    ],
)
def test_what_is_not_held(got: Any) -> None:
    want = _keys()
    assert not holds([got(want).astype(np.float32)], want, ATOL)


def test_pieces_that_cover_every_position_hold_the_keys() -> None:
    want = _keys()
    prompt, steps = want[:, :12], [want[:, 12:13]]
    assert covered([prompt, *steps], want, ATOL)
    assert covered([np.concatenate([want, want])[:, :12], want[:, 12:]], want, ATOL)  # rows
    one_per_token = [want[:, i : i + 1] for i in range(13)]
    assert covered(one_per_token, want, ATOL)


@pytest.mark.parametrize(
    "pieces",
    [
        lambda w: [w[:, :12]],  # the step's piece missing
        lambda w: [w[:, :11], w[:, 12:]],  # a gap
        lambda w: [w[:1, :12], w[1:, 12:]],  # one row's prompt, the other row's step
        lambda w: [w[:, :12] + 0.05, w[:, 12:]],  # other values
    ],
)
def test_pieces_that_leave_a_position_out_do_not_hold(pieces: Any) -> None:
    want = _keys()
    assert not covered([p.astype(np.float32) for p in pieces(want)], want, ATOL)


def test_a_piece_beside_a_cache_the_probe_cannot_read_is_not_judged() -> None:
    """A model that keeps this call's keys (a piece of one position) beside a cache of a
    layout the probe cannot read: nothing is found, nothing is blamed."""
    k, v = _keys(1), _keys(2)
    expected = {"layers": [{"k": k, "v": v}], "logits": np.zeros((2, 5))}
    arrays = {"c0": k[:, 12:], "logits": np.zeros((2, 5), np.float32)}
    assert observation(expected, arrays, ATOL) == {"nothing_found": True}
    arrays = {"c0": k[:, :12], "c1": k[:, 12:], "logits": np.zeros((2, 5), np.float32)}
    assert observation(expected, arrays, ATOL) == {"not_held": [["values", 0]]}


def test_the_worker_sends_pieces_in_both_layouts_where_their_shape_allows() -> None:
    """A piece of as many positions as a head count reads either way; one of fewer
    positions than the probe has seen goes back as a piece, never as a whole cache."""

    class Pieces(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = [torch.zeros(2, 12, 2, HEAD_DIM), torch.ones(2, 2, 2, HEAD_DIM)]

    arrays, _ = adapter_cache.held_arrays(Pieces(), 13, HEADS, HEAD_DIM)
    shapes = sorted(a.shape for a in arrays.values())
    assert not [k for k in arrays if k.startswith("t")]
    assert shapes == [(2, 2, 2, HEAD_DIM), (2, 2, 2, HEAD_DIM), (2, 12, 2, HEAD_DIM)]


def test_keys_before_rope_count_as_held() -> None:
    """A cache of W_k(x) that rotates the keys when it reads them holds them too."""
    k, k_raw, v = _keys(1), _keys(2), _keys(3)
    expected = {"layers": [{"k": k, "k_raw": k_raw, "v": v}], "logits": np.zeros((2, 5))}
    arrays = {"t0": k_raw, "t1": v, "logits": np.zeros((2, 5), np.float32)}
    assert observation(expected, arrays, ATOL) == {"not_held": []}
    arrays = {"t0": v, "logits": np.zeros((2, 5), np.float32)}
    assert observation(expected, arrays, ATOL) == {"not_held": [["keys", 0]]}


def test_the_probe_sends_back_the_seen_positions_only(probe: dict[str, Any]) -> None:
    _, header = seen_by(SOLUTION, probe)
    assert header["dtypes"] == {"cache": ["float32"], "model": "float32"}


def test_a_wider_cache_is_noted_never_judged() -> None:
    assert "float64" in dtype_note({"cache": ["float64"], "model": "float32"})
    assert dtype_note({"cache": ["float32"], "model": "float32"}) == ""
    assert dtype_note({"cache": "float64"}) == dtype_note(None) == ""


# ------------------------------------------------------------ in a grading


def test_a_partial_cache_loses_3_7_and_3_11_whatever_its_timing(tmp_path: Path) -> None:
    """Graded in the sandbox: both checks fail on what the cache holds before anything is
    timed (so every run, on any machine), naming the layer, the keys and the mistake."""
    mutant = LIBRARY["keys_reprojected_one_layer"]
    root = patched_solution(tmp_path / "sub", mutant.file, list(mutant.edits))
    limits = Limits(request_timeout_s=60.0, startup_timeout_s=60.0)
    graded = run_grade(
        root, tmp_path / "out", parts=["part3"], limits=limits, numbers=frozenset({"3.7", "3.11"})
    )
    for number in ("3.7", "3.11"):
        assert graded.score(number) == 0, graded.output(number)
        assert "the keys of layer 0 " in graded.output(number)
        assert mutant.diagnosis in graded.output(number)
