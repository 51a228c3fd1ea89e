"""Which piece of the submission's model first computes a wrong value, from one trace.

A trace (``adapter_trace``) holds, for every call of a forward plan, the input and output of
each decoder layer, its attention and its feed-forward block, the logits and the cache the
call handed back. Each piece is recomputed by :mod:`reference_np` on the very input the
submission gave it (the attention of a cached call also on the attention inputs of the
earlier calls, which its cache should hold the keys and values of), so a piece is judged
alone: a wrong value upstream does not make a right piece look wrong. The pieces are read
in the order the model runs them, and the first that departs is the finding, with what
it computed where that is one of a few hypotheses tested on the same input (the positions
it embedded at, the keys its attention saw, what its cache holds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grader.parts.part2.reference_np import VIEWS, Reference


@dataclass(frozen=True)
class PlanResult:
    """One plan's run against the reference: ``call`` and ``pos`` of the first departure
    (0-based; None when right), the largest difference, or the error it raised."""

    label: str
    steps: list[int] | None
    call: int | None = None
    pos: int | None = None
    error: float = 0.0
    raised: str = ""

    @property
    def right(self) -> bool:
        return self.call is None and not self.raised


@dataclass(frozen=True)
class Finding:
    """The first piece that departs: ``piece`` (embedding, attention_input, attention,
    feed_forward, layer, head), the call (0-based) of a plan, the layer (or -1), the
    largest difference, and ``facts``: what the experiments on that piece found."""

    piece: str
    call: int
    layer: int
    error: float
    facts: dict[str, Any] = field(default_factory=dict)


def off(got: Any, want: np.ndarray) -> float:
    """The largest difference (inf for a missing array, another shape or NaN)."""
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        return float("inf")
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    return err if np.isfinite(err) else float("inf")


def embedded_at(ref: Reference, chunk: np.ndarray, got: np.ndarray, atol: float) -> int | None:
    """The first position from which ``chunk`` embedded gives ``got``, if one does."""
    rows = ref.w("pos_embedding.weight").shape[0]
    for start in range(rows - chunk.shape[1] + 1):
        if off(got, ref.embed(chunk, start)) <= atol:
            return start
    return None


def attention_view(
    ref: Reference, i: int, a_in: np.ndarray, past: np.ndarray | None, got: np.ndarray, atol: float
) -> str | None:
    """Which of the views (:data:`VIEWS`) other than the causal one gives ``got``; None."""
    for view in VIEWS[1:]:
        want = ref.attention(i, a_in, past, view)
        if off(got, want) <= atol and off(ref.attention(i, a_in, past), want) > atol:
            return view
    return None


def attention_scale(
    ref: Reference, i: int, a_in: np.ndarray, past: np.ndarray | None, got: np.ndarray, atol: float
) -> float | None:
    """The one divisor of the scores (other than sqrt(d_model)) under which the causal
    attention gives ``got``, found on a log grid from 0.1 to 10^4 and refined; None."""

    def error(s: float) -> float:
        return off(got, ref.attention(i, a_in, past, scale=float(s)))

    grid = np.geomspace(0.1, 1e4, 121)
    best = float(grid[int(np.argmin([error(s) for s in grid]))])
    for width in (1.1, 1.005):
        fine = np.geomspace(best / width, best * width, 41)
        best = float(fine[int(np.argmin([error(s) for s in fine]))])
    if error(best) > atol or abs(best / np.sqrt(a_in.shape[-1]) - 1) < 1e-2:
        return None
    return best


def cache_facts(
    ref: Reference, i: int, inputs: np.ndarray, k: Any, v: Any, atol: float
) -> dict[str, Any]:
    """What layer ``i``'s handed-back cache (``k``, ``v``) holds against the keys and values
    of its attention inputs ``inputs`` (B, T_total, D): empty when both are right, else
    which tensor is wrong, its shape or wrong positions, and what it holds instead."""
    keys, values = ref.keys_values(i, inputs)
    facts: dict[str, Any] = {}
    for name, got, want, other in (("keys", k, keys, values), ("values", v, values, keys)):
        if off(got, want) <= atol:
            continue
        if not isinstance(got, np.ndarray) or got.ndim != 3 or got.shape[0] != want.shape[0]:
            shape = None if not isinstance(got, np.ndarray) else list(got.shape)
            facts[name] = {"shape": shape, "want": list(want.shape)}
            continue
        fact: dict[str, Any] = {"shape": list(got.shape), "want": list(want.shape)}
        if got.shape == want.shape and off(got, other) <= atol:
            fact["holds"] = "the values" if name == "keys" else "the keys"
        elif got.shape == want.shape and off(got, inputs) <= atol:
            fact["holds"] = "the attention's inputs"
        if got.shape == want.shape:
            err = np.abs(got.astype(np.float64) - want).max(axis=(0, 2))
            fact["positions"] = [int(p) for p in np.flatnonzero(~(err <= atol))]
        slots = position_map(got, want, atol)
        if slots is not None and slots != list(range(len(slots))):
            fact["slots"] = slots
        facts[name] = fact
    return facts


def position_map(got: np.ndarray, want: np.ndarray, atol: float) -> list[int] | None:
    """For each position slot of ``got`` (B, T', D), the position of ``want`` (B, T, D) it
    holds, -1 where none; None when the widths differ."""
    if got.shape[2:] != want.shape[2:] or got.shape[0] != want.shape[0]:
        return None
    slots = []
    for s in range(got.shape[1]):
        err = np.abs(want - got[:, s : s + 1].astype(np.float64)).max(axis=(0, 2))
        hits = np.flatnonzero(err <= atol)
        slots.append(int(hits[0]) if hits.size else -1)
    return slots


def layer_input_finding(
    ref: Reference, trace: dict[str, np.ndarray], c: int, chunk: np.ndarray, start: int, atol: float
) -> Finding | None:
    """Layer 0's input in call ``c`` against the embedding of its tokens at ``start``."""
    got = trace.get(f"c{c}.l0.layer.in")
    if got is None:
        return None
    error = off(got, ref.embed(chunk, start))
    if error <= atol:
        return None
    width = ref.w("token_embedding.weight").shape[1]
    facts: dict[str, Any] = {"start": start, "tokens": int(chunk.shape[1]), "width": width}
    at = embedded_at(ref, chunk, got, atol) if isinstance(got, np.ndarray) else None
    if at is not None:
        facts["embedded_at"] = at
    return Finding("embedding", c, 0, error, facts)


def attention_finding(
    ref: Reference, trace: dict[str, np.ndarray], c: int, i: int, atol: float
) -> Finding | None:
    """Layer ``i``'s attention in call ``c``: its input against norm1 of the layer's input,
    and its output against attention on that input after the earlier calls' inputs."""
    x_in, a_in = trace.get(f"c{c}.l{i}.layer.in"), trace.get(f"c{c}.l{i}.attention.in")
    a_out = trace.get(f"c{c}.l{i}.attention.out")
    if a_in is None or a_out is None:
        return None
    if x_in is not None:
        error = off(a_in, ref.norm(f"layers.{i}.norm1", x_in))
        if error > atol:
            facts = {"given": "the layer's input itself"} if off(a_in, x_in) <= atol else {}
            return Finding("attention_input", c, i, error, facts)
    earlier = [trace.get(f"c{e}.l{i}.attention.in") for e in range(c)]
    if any(e is None or e.shape[0] != a_in.shape[0] for e in earlier):
        return None
    past = np.concatenate(earlier, axis=1).astype(np.float64) if earlier else None
    a_in = a_in.astype(np.float64)
    error = off(a_out, ref.attention(i, a_in, past))
    if error <= atol:
        return None
    facts: dict[str, Any] = {"past": 0 if past is None else int(past.shape[1])}
    if (view := attention_view(ref, i, a_in, past, a_out, atol)) is not None:
        facts["view"] = view
    elif (scale := attention_scale(ref, i, a_in, past, a_out, atol)) is not None:
        facts.update(scale=scale, d_model=int(a_in.shape[-1]))
    return Finding("attention", c, i, error, facts)


def block_finding(
    ref: Reference, trace: dict[str, np.ndarray], c: int, i: int, atol: float
) -> Finding | None:
    """Layer ``i``'s feed-forward block on its own input, then the layer's output against
    its input plus its attention's and feed-forward block's outputs (the pre-LN wiring)."""
    f_in, f_out = trace.get(f"c{c}.l{i}.feed_forward.in"), trace.get(f"c{c}.l{i}.feed_forward.out")
    if f_in is not None and f_out is not None:
        error = off(f_out, ref.feed_forward(i, f_in.astype(np.float64)))
        if error > atol:
            return Finding("feed_forward", c, i, error)
    x_in, x_out = trace.get(f"c{c}.l{i}.layer.in"), trace.get(f"c{c}.l{i}.layer.out")
    a_out = trace.get(f"c{c}.l{i}.attention.out")
    if x_in is None or x_out is None or a_out is None:
        return None
    mid = x_in.astype(np.float64) + a_out
    want = mid + ref.feed_forward(i, ref.norm(f"layers.{i}.norm2", mid))
    error = off(x_out, want)
    return Finding("layer", c, i, error) if error > atol else None


def cache_finding(
    ref: Reference, trace: dict[str, np.ndarray], c: int, atol: float
) -> Finding | None:
    """The first layer whose cache, as call ``c - 1`` handed it back, does not hold the
    keys and values of the attention inputs of calls 0 to ``c - 1`` (each layer's pair
    judged only where the trace holds both tensors)."""
    for i in range(ref.layers):
        k, v = trace.get(f"c{c - 1}.k{i}"), trace.get(f"c{c - 1}.v{i}")
        earlier = [trace.get(f"c{e}.l{i}.attention.in") for e in range(c)]
        if k is None or v is None or any(e is None for e in earlier):
            continue
        inputs = np.concatenate(earlier, axis=1).astype(np.float64)
        if held := cache_facts(ref, i, inputs, k, v, atol):
            keys, values = ref.keys_values(i, inputs)
            error = max(off(k, keys), off(v, values))
            return Finding("cache", c, i, error, {"cache": held, "past": int(inputs.shape[1])})
    return None


def first_departure(
    ref: Reference, trace: dict[str, np.ndarray], ids: np.ndarray, plan: list[int], atol: float
) -> Finding | None:
    """The first piece, in the order the model runs them over the calls of ``plan``, whose
    output departs from the reference's on its own input; None when none does (or the
    trace holds too little to tell). A piece that departs in a later call is preceded by
    the cache the call before handed it: where that cache does not hold the keys and
    values of the tokens seen, it is the finding (a position read from a short cache is
    right for that cache)."""
    found = first_piece(ref, trace, ids, plan, atol)
    if found is not None and found.call > 0:
        return cache_finding(ref, trace, found.call, atol) or found
    return found


def first_piece(
    ref: Reference, trace: dict[str, np.ndarray], ids: np.ndarray, plan: list[int], atol: float
) -> Finding | None:
    start = 0
    for c, n in enumerate(plan):
        chunk = ids[:, start : start + n]
        if found := layer_input_finding(ref, trace, c, chunk, start, atol):
            return found
        for i in range(ref.layers):
            if i > 0:
                prev, now = trace.get(f"c{c}.l{i - 1}.layer.out"), trace.get(f"c{c}.l{i}.layer.in")
                if prev is not None and now is not None and off(now, prev) > atol:
                    return Finding("between_layers", c, i, off(now, prev))
            found = attention_finding(ref, trace, c, i, atol) or block_finding(
                ref, trace, c, i, atol
            )
            if found:
                return found
        last, logits = trace.get(f"c{c}.l{ref.layers - 1}.layer.out"), trace.get(f"c{c}.logits")
        if last is not None and logits is not None:
            error = off(logits, ref.head(last.astype(np.float64)))
            if error > atol:
                return Finding("head", c, -1, error)
        start += n
    return None
