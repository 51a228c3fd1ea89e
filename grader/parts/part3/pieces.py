"""Which piece of the student's Llama first computes a wrong value, from one recorded plan.

The worker records, for every call of a forward plan, the output of the token embeddings,
of each layer and of each layer's attention and feed-forward, and the inputs of the last
two (``adapter_isolate.run_stages``). Each piece is recomputed here by the grader's own
model (:mod:`.reference`) on the very input the student's piece was given: the attention
on the attention inputs of every position so far (what its cache should hold the keys and
values of), so that a wrong value upstream never makes a right piece look wrong. The
pieces are read in the order the model runs them; the first that departs is the finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.parts.part3.reference import ReferenceLlama

#: A piece departs when it is off by more than this, relative to its values' scale (float32
#: arithmetic on the same input stays below 1e-5 of it).
RELATIVE_TOL = 1e-3


@dataclass(frozen=True)
class Finding:
    """The first piece that departs: ``piece`` (embeddings, attention_input, attention,
    ffn_input, feed_forward, layer, logits), its layer (-1 for the embeddings, n_layers for
    the logits), the first position
    that departs (0-based) and the largest difference."""

    piece: str
    layer: int
    position: int
    error: float


def departure(got: Any, want: np.ndarray, atol: float) -> tuple[int, float] | None:
    """The first position (axis 1) where ``got`` departs from ``want`` and the largest
    difference; None where it does not. A missing array or one of another shape departs
    at position 0, NaN wherever it is."""
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        return 0, float("inf")
    err = np.abs(got.astype(np.float64) - want).max(axis=(0, 2))
    tol = max(atol, RELATIVE_TOL * float(np.abs(want).max(initial=0.0)))
    bad = np.flatnonzero(~(err <= tol))
    if not bad.size:
        return None
    return int(bad[0]), float(np.nanmax(np.where(np.isnan(err), np.inf, err)))


def layer_checks(
    ref: ReferenceLlama, arrays: dict[str, np.ndarray], i: int, layer_in: np.ndarray
) -> list[tuple[str, Any, Any]]:
    """Layer ``i``'s pieces as (piece, recorded, what the reference makes of the recorded
    input), in the order they run; a piece whose record is missing is left out (with what
    depends on it)."""
    a_in, a_out = arrays.get(f"in.attention.{i}"), arrays.get(f"out.attention.{i}")
    f_in, f_out = arrays.get(f"in.feed_forward.{i}"), arrays.get(f"out.feed_forward.{i}")
    out = arrays.get(f"out.layer.{i}")
    checks: list[tuple[str, Any, Any]] = []
    if a_in is not None:
        checks.append(("attention_input", a_in, lambda: ref.norm_on(layer_in, norm(i, "attn"))))
        if a_out is not None:
            checks.append(("attention", a_out, lambda: ref.attention_on(i, a_in)))
    if a_out is not None and f_in is not None:
        h = layer_in.astype(np.float64) + a_out
        checks.append(("ffn_input", f_in, lambda: ref.norm_on(h, norm(i, "ffn"))))
        if f_out is not None:
            checks.append(("feed_forward", f_out, lambda: ref.feed_forward_on(i, f_in)))
    if a_out is not None and f_out is not None and out is not None:
        checks.append(("layer", out, lambda: layer_in.astype(np.float64) + a_out + f_out))
    return checks


def norm(i: int, which: str) -> str:
    return f"layers.{i}.{'attention_norm' if which == 'attn' else 'ffn_norm'}"


def first_departure(
    ref: ReferenceLlama, arrays: dict[str, np.ndarray], tokens: np.ndarray, atol: float
) -> Finding | None:
    """The first piece of the recorded plan ``arrays`` (for ``tokens``) that departs from
    the reference's value on its own input; None where none departs or the record stops
    before the piece that would (a layer without its output recorded ends the reading)."""
    emb = arrays.get("out.embeddings")
    if emb is None:
        return None
    if (off := departure(emb, ref.embed(tokens), atol)) is not None:
        return Finding("embeddings", -1, *off)
    layer_in = emb
    for i in range(ref.n_layers):
        for piece, got, want in layer_checks(ref, arrays, i, layer_in):
            if (off := departure(got, want(), atol)) is not None:
                return Finding(piece, i, *off)
        layer_in = arrays.get(f"out.layer.{i}")
        if layer_in is None:
            return None
    if (off := departure(arrays.get("logits"), ref.head(layer_in), atol)) is not None:
        return Finding("logits", ref.n_layers, *off)
    return None


@dataclass(frozen=True)
class PlanRun:
    """One plan on the grader's tokens: where its logits first depart (None: right), the
    call that position belongs to, the first piece that departs, or what it raised."""

    mode: str
    steps: list[list[int]]
    position: int | None = None
    error: float = 0.0
    finding: Finding | None = None
    raised: str = ""
    rows: tuple[int, ...] = ()  # the rows (0-based) whose logits depart

    @property
    def right(self) -> bool:
        return self.position is None and not self.raised

    @property
    def call(self) -> int:
        """The 0-based call of the first departing position."""
        ends = np.cumsum([n for _, n in self.steps])
        return int(np.searchsorted(ends, self.position or 0, side="right"))
