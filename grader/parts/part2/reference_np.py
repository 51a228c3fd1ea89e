"""The course model in NumPy, in the grader: the reference's values on inputs the isolating
experiments choose, piece by piece.

The Part 2 isolation (:mod:`grader.parts.part2.isolate_forward`) compares what each piece
of the submission's model computed (each layer, its attention, its feed-forward block, the
cache it handed back) with what that piece should compute on the very input the
submission gave it. That needs the reference's arithmetic on arbitrary inputs, which no
stored case holds, and no reference worker (it would stop the submission's). The model is
the handout's and the course weights' (``cases`` module): learned positions, pre-LN
layers of single-head attention without biases and a ReLU feed-forward block, a final
norm and the output projection; dropout is off (evaluation). Everything is float64.
:func:`trustworthy` checks these functions against the stored expected logits of the
public cases before any experiment believes them, so a change of the model that this
file missed silences the isolation instead of making it name a wrong cause.

Attention takes a ``view``: which keys a query sees. ``"causal"`` is the handout's; the
others are the ways a cached step can see the wrong ones, each a hypothesis an experiment
can test on the submission's own inputs (see :data:`VIEWS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: What a new token may see, as the hypotheses the attention experiment tests: the
#: handout's causal view, the new tokens alone (the cache not read), the cached tokens
#: and the earlier new ones but not itself, and no mask at all (later tokens of a chunk).
VIEWS = ("causal", "new_only", "not_itself", "unmasked")
EPS = 1e-5  # nn.LayerNorm's default


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * weight + bias


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def visible(t_new: int, t_total: int, view: str) -> np.ndarray:
    """(t_new, t_total) True where new token i may look under ``view``."""
    past = t_total - t_new
    col = np.arange(t_total)[None, :]
    row = np.arange(t_new)[:, None] + past  # each new token's absolute position
    if view == "causal":
        return col <= row
    if view == "new_only":
        return (col >= past) & (col <= row)
    if view == "not_itself":
        seen = col < row
        seen[:, 0] |= row[:, 0] == 0  # the very first token has nothing else to see
        return seen
    if view == "unmasked":
        return np.ones((t_new, t_total), dtype=bool)
    raise ValueError(f"unknown view {view!r}")


@dataclass
class Reference:
    """The course model of ``weights`` (state-dict keys to arrays) in float64."""

    weights: dict[str, np.ndarray]

    def w(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name], dtype=np.float64)

    @property
    def layers(self) -> int:
        return sum(1 for k in self.weights if k.endswith(".attention.W_q.weight"))

    # ------------------------------------------------------------------ pieces

    def embed(self, ids: np.ndarray, start: int) -> np.ndarray:
        """Token plus position embeddings of ``ids`` (B, T) at positions start, start+1, ..."""
        positions = np.arange(start, start + ids.shape[1])
        return self.w("token_embedding.weight")[ids] + self.w("pos_embedding.weight")[positions]

    def keys_values(self, i: int, normed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Layer ``i``'s K = W_k(x) and V = W_v(x) of its attention's input ``normed``."""
        p = f"layers.{i}.attention."
        return normed @ self.w(p + "W_k.weight").T, normed @ self.w(p + "W_v.weight").T

    def attention(
        self,
        i: int,
        normed: np.ndarray,
        past: np.ndarray | None,
        view: str = "causal",
        scale: float | None = None,
    ) -> np.ndarray:
        """Layer ``i``'s attention output for the new inputs ``normed`` (B, T_new, D), after
        the attention inputs ``past`` (B, T_past, D) of the tokens before them (or None);
        the scores divided by ``scale`` (None: sqrt(d_model), the handout's)."""
        p = f"layers.{i}.attention."
        every = normed if past is None else np.concatenate([past, normed], axis=1)
        q = normed @ self.w(p + "W_q.weight").T
        k, v = self.keys_values(i, every)
        scores = q @ k.transpose(0, 2, 1) / (np.sqrt(q.shape[-1]) if scale is None else scale)
        seen = visible(normed.shape[1], every.shape[1], view)
        weights = softmax(np.where(seen[None], scores, -np.inf))
        return (weights @ v) @ self.w(p + "W_o.weight").T

    def feed_forward(self, i: int, x: np.ndarray) -> np.ndarray:
        p = f"layers.{i}.feed_forward."
        hidden = np.maximum(x @ self.w(p + "fc1.weight").T + self.w(p + "fc1.bias"), 0.0)
        return hidden @ self.w(p + "fc2.weight").T + self.w(p + "fc2.bias")

    def norm(self, name: str, x: np.ndarray) -> np.ndarray:
        return layer_norm(x, self.w(f"{name}.weight"), self.w(f"{name}.bias"))

    def layer(self, i: int, x: np.ndarray, past: np.ndarray | None) -> tuple[Any, ...]:
        """Layer ``i`` on ``x`` after the attention inputs ``past``: the output, and the
        attention's input (what a later call's ``past`` is made of)."""
        normed = self.norm(f"layers.{i}.norm1", x)
        x = x + self.attention(i, normed, past)
        return x + self.feed_forward(i, self.norm(f"layers.{i}.norm2", x)), normed

    def head(self, x: np.ndarray) -> np.ndarray:
        return self.norm("norm", x) @ self.w("output_projection.weight").T + self.w(
            "output_projection.bias"
        )

    # ------------------------------------------------------------------ whole runs

    def run(self, ids: np.ndarray) -> dict[str, Any]:
        """The whole sequence at once: logits (B, T, vocab), every layer's input and output,
        and every layer's keys and values of every position."""
        x = self.embed(np.asarray(ids), 0)
        inputs, outputs, keys, values = [], [], [], []
        for i in range(self.layers):
            inputs.append(x)
            x, normed = self.layer(i, x, None)
            outputs.append(x)
            k, v = self.keys_values(i, normed)
            keys.append(k)
            values.append(v)
        return {
            "logits": self.head(x),
            "inputs": inputs,
            "outputs": outputs,
            "keys": keys,
            "values": values,
        }

    def logits(self, ids: np.ndarray) -> np.ndarray:
        return self.run(ids)["logits"]


def trustworthy(reference: Reference, cases: list[dict[str, Any]], atol: float) -> bool:
    """Whether ``reference`` gives the stored expected logits (without the cache) of the
    first public cases, well within ``atol``: only then may an experiment believe it."""
    try:
        for case in cases[:2]:
            want = np.asarray(case["expected_logits_no_cache"], dtype=np.float64)
            got = reference.logits(np.asarray(case["input_ids"]))
            if got.shape != want.shape or not np.max(np.abs(got - want)) <= atol / 10:
                return False
    except Exception:  # a reference that cannot run is not one
        return False
    return bool(cases)
