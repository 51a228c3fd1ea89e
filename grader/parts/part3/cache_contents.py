"""What Part 3's cache holds: the keys and values of the tokens seen, in every layer.

A design that keeps each layer's inputs and projects the keys or values again from them
at every step (in one layer, or the values of every layer) gives the right logits and
does most of a cache's saving, so the timed probes can miss it. This probe judges what
the model holds instead: after a prefill and one decode step with ``kv_caching`` on,
called as generate calls forward, the worker sends back the seen positions of every
tensor that may be the cache (``adapter_cache.held_arrays``: wherever an honest design
keeps it, in either layout, whole or as a list of pieces joined when read), and the
grader looks among them for the reference's keys (after RoPE, or before it for a cache
that rotates them when it reads) and values of each layer, stored with the hidden cases.
Expected values never enter the worker. Where the model holds no such tensor at all,
nothing is said: the timed probes judge alone.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from grader.core.arrays import decode_array, encode_array
from grader.parts.part3.support import Part3Base
from grader.runtime.outcomes import SubmissionError

#: The hidden file that holds the probe and the reference's keys and values.
CACHE_FILE = "hidden/part3_cache.json"
#: The probe: a prefill of CONTENTS_PREFIX seeded ids in CONTENTS_ROWS rows on the public
#: model, then one decode step. More positions than any head count, so the two layouts
#: cannot be confused.
CONTENTS_PREFIX, CONTENTS_ROWS, CONTENTS_SEED = 12, 2, 4141
#: The keys of a layer are held in either form; its values in one.
FORMS = {"keys": ("k", "k_raw"), "values": ("v",)}


def reference_layers(model: Any, tokens: np.ndarray, prefix: int) -> dict[str, Any]:
    """``regen``: the reference's keys and values of every layer after the probe's calls,
    each (rows, prefix + 1, n_kv_heads, head_dim): ``k`` after RoPE and ``v`` read from its
    cache, ``k_raw`` (W_k(x), before RoPE) from what each layer's ``wk`` returned; and the
    decode step's logits (rows, vocab)."""
    import torch

    rows, seen = tokens.shape[0], prefix + 1
    raw: list[list[Any]] = [[] for _ in model.layers]
    hooks = [
        layer.attention.wk.register_forward_hook(lambda _m, _i, out, i=i: raw[i].append(out))
        for i, layer in enumerate(model.layers)
    ]
    ids = torch.as_tensor(tokens, dtype=torch.long)
    try:
        with torch.inference_mode():
            model(ids[:, :prefix], 0)
            logits = model(ids[:, prefix:seen], prefix)[:, -1].float().numpy().copy()
    finally:
        for hook in hooks:
            hook.remove()
    layers = []
    for layer, outputs in zip(model.layers, raw, strict=True):
        att = layer.attention
        k_raw = torch.cat(outputs, dim=1).view(rows, seen, att.n_kv_heads, att.head_dim)
        layers.append(
            {
                "k": att.cache_k[:rows, :seen].float().numpy().copy(),
                "k_raw": k_raw.float().numpy().copy(),
                "v": att.cache_v[:rows, :seen].float().numpy().copy(),
            }
        )
    return {"layers": layers, "logits": logits}


def reference_probe(models: dict[str, Any], vocab: int) -> tuple[np.ndarray, dict[str, Any]]:
    """``regen``: the probe's seeded ids and what the reference holds and answers for each
    RoPE convention (``models``: convention -> the reference's cached model)."""
    rng = np.random.default_rng(CONTENTS_SEED)
    ids = rng.integers(0, vocab, (CONTENTS_ROWS, CONTENTS_PREFIX + 1))
    return ids, {rope: reference_layers(m, ids, CONTENTS_PREFIX) for rope, m in models.items()}


def probe_document(tokens: np.ndarray, by_rope: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``regen``: the hidden file of this probe, its expected values per RoPE convention."""
    encoded = {
        rope: {
            "layers": [{f: encode_array(a) for f, a in layer.items()} for layer in ref["layers"]],
            "logits": encode_array(ref["logits"]),
        }
        for rope, ref in by_rope.items()
    }
    return {
        "part": "part3",
        "model": "public",
        "prefix": CONTENTS_PREFIX,
        "tokens": tokens.tolist(),
        "expected": encoded,
    }


def holds(arrays: list[np.ndarray], want: np.ndarray, atol: float) -> bool:
    """Whether one of ``arrays`` (each (N, T, H, D)) holds ``want`` (rows, T, n_kv_heads,
    D) in some run of consecutive rows, within ``atol`` relative to its largest value; a
    cache of every query head (GQA expanded before the cache) holds it repeated as
    ``repeat_kv`` repeats it. NaN never matches."""
    rows, _, kv_heads, _ = want.shape
    tol = atol * max(1.0, float(np.max(np.abs(want))))
    for got in arrays:
        if got.ndim != 4 or got.shape[0] < rows or got.shape[1] != want.shape[1]:
            continue
        if got.shape[3] != want.shape[3] or got.shape[2] % kv_heads:
            continue
        target = np.repeat(want, got.shape[2] // kv_heads, axis=2).astype(np.float64)
        for j in range(got.shape[0] - rows + 1):
            if np.max(np.abs(got[j : j + rows] - target)) <= tol:  # NaN fails
                return True
    return False


def covered(chunks: list[np.ndarray], want: np.ndarray, atol: float) -> bool:
    """Whether ``chunks`` (each (N, t, H, D), t shorter than ``want``'s T) hold ``want``
    (rows, T, n_kv_heads, D) between them: a cache kept as a list of pieces (the prompt's,
    then one per step) and joined when read. Each chunk may stand at any position and in
    any run of consecutive rows, as :func:`holds` allows; ``want`` is held where, for one
    run of rows, the positions the chunks match cover every position seen."""
    rows, total, kv_heads, _ = want.shape
    tol = atol * max(1.0, float(np.max(np.abs(want))))
    seen_at: dict[int, np.ndarray] = {}
    for got in chunks:
        if got.ndim != 4 or got.shape[0] < rows or not 0 < got.shape[1] < total:
            continue
        if got.shape[3] != want.shape[3] or got.shape[2] % kv_heads:
            continue
        target = np.repeat(want, got.shape[2] // kv_heads, axis=2).astype(np.float64)
        t = got.shape[1]
        for j in range(got.shape[0] - rows + 1):
            piece = got[j : j + rows]
            for start in range(total - t + 1):
                if np.max(np.abs(piece - target[:, start : start + t])) <= tol:  # NaN fails
                    seen_at.setdefault(j, np.zeros(total, bool))[start : start + t] = True
    return any(positions.all() for positions in seen_at.values())


def observation(
    expected: dict[str, Any], arrays: dict[str, np.ndarray], atol: float
) -> dict[str, Any]:
    """What the probe saw: ``not_held``, the [kind, layer] pairs ("keys" or "values") that
    no tensor the model holds holds; ``nothing_found`` where it holds no tensor that may
    be a cache; ``logits_differ`` where the step's logits are not the reference's (a
    forward that is wrong has other keys and values: checks 3.3 to 3.5 judge it).
    ``expected``: the reference's ``layers`` and ``logits`` (arrays or their encodings).
    Plain JSON, so that ``regen`` stores it as a mistake's signature."""
    want = _array(expected["logits"])
    got = arrays.get("logits")
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        return {"logits_differ": True}
    if not np.max(np.abs(got.astype(np.float64) - want), initial=0.0) <= atol:  # NaN fails
        return {"logits_differ": True}
    held = [a for k, a in arrays.items() if k.startswith("t") and isinstance(a, np.ndarray)]
    chunks = [a for k, a in arrays.items() if k.startswith("c") and isinstance(a, np.ndarray)]
    missing, pieces = [], False
    for i, layer in enumerate(expected["layers"]):
        for kind, forms in FORMS.items():
            wants = [_array(layer[f]) for f in forms if f in layer]
            if any(holds(held, w, atol) for w in wants):
                continue
            if chunks and any(covered(chunks, w, atol) for w in wants):
                pieces = True
                continue
            missing.append([kind, i])
    # Pieces count as the cache only where they hold some layer's keys or values whole: a
    # tensor kept for another reason (this call's keys, say) beside a cache of a layout the
    # probe cannot read is not a cache that leaves the rest out.
    if not held and not pieces:
        return {"nothing_found": True}
    return {"not_held": missing}


def _array(value: Any) -> np.ndarray:
    return value if isinstance(value, np.ndarray) else decode_array(value)


def contents_verdict(seen: dict[str, Any], prefix: int) -> str:
    """Why the probe's observation ``seen`` shows a cache that does not hold every layer's
    keys and values ("" when it holds them, or nothing that may be a cache was found)."""
    missing = seen.get("not_held") or []
    if not missing:
        return ""
    parts = []
    for kind in FORMS:
        layers = [str(i) for k, i in missing if k == kind]
        if layers:
            listed = f"{', '.join(layers[:-1])} and {layers[-1]}" if layers[1:] else layers[0]
            which = f"layer{'s' if layers[1:] else ''} {listed}"
            parts.append(f"the {kind} of {which}")
    return (
        f"after a prefill of {prefix} tokens and one decode step with kv_caching=True (forward "
        "called at start_pos as generate calls it), no tensor your model keeps holds "
        f"{' or '.join(parts)} (counting layers from 0) for the {prefix + 1} positions seen. "
        "With the cache, every layer must keep the keys (after RoPE) and values of every "
        "token seen, K = W_k(x) and V = W_v(x), so that a step projects its new token only; "
        "keeping a layer's inputs and projecting its keys or values again from them at every "
        "step is not a KV cache, however cheap that part is."
    )


def dtype_note(dtypes: Any) -> str:
    """A note where the tensors that hold the cache are of a wider float than the model's
    weights ("" otherwise): reported, never judged here (check 3.1 judges the memory)."""
    widths = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
    if not isinstance(dtypes, dict) or not isinstance(dtypes.get("cache"), list):
        return ""
    model = widths.get(str(dtypes.get("model")), 0)
    wider = [d for d in dtypes["cache"] if isinstance(d, str) and widths.get(d, 0) > model]
    if not model or not wider:
        return ""
    return (
        f"Note: your cache holds {', '.join(wider)} tensors where the model's weights are "
        f"{dtypes['model']}: each cached key and value takes more memory than it needs."
    )


class Part3CacheContents(Part3Base):
    """Checks 3.7 and 3.11 ask what the cache holds (once per grading, one small request)."""

    def cache_contents_problem(self) -> str:
        """Why the cache after the probe's calls does not hold every layer's keys and
        values ("" when it does, without the hidden file, or when forward cannot run: the
        checks of forward name why). Asked once per grading; 3.7 and 3.11 share it."""
        return self.once_per_grading("cache_contents", self.look_at_cache_contents)

    def look_at_cache_contents(self) -> str:
        """One ``cache_contents`` request and its verdict (see the module's docstring)."""
        path = self.ctx.cases_root / CACHE_FILE
        if not path.is_file():
            return ""
        probe = json.loads(path.read_text())
        expected = probe["expected"].get(self.rope()) or probe["expected"]["scaled"]
        params = self.meta()["models"][probe["model"]]["params"]
        header = {
            "op": "cache_contents",
            "model": probe["model"],
            "kv_caching": True,
            "prefix": probe["prefix"],
            "heads": [params["n_kv_heads"], params["n_heads"]],
            "head_dim": params["dim"] // params["n_heads"],
        }
        tokens = np.asarray(probe["tokens"], dtype=np.int64)
        try:
            reply = self.call(header, {"tokens": tokens}, "looking at what the cache holds")
        except SubmissionError:
            return ""  # the checks of forward name why it cannot run
        note = dtype_note(reply.header.get("dtypes"))
        if note:
            print(note)
        seen = observation(expected, reply.arrays, self.atol())
        problem = contents_verdict(seen, int(probe["prefix"]))
        if problem:
            problem = f"{problem}\n{self.name_mistakes('cache_contents', seen)}".strip()
        return problem
