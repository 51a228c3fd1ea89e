"""The grader's own Llama, in NumPy: trusted values for Part 3's isolating experiments.

The isolating experiments (:mod:`.isolate_forward`, :mod:`.isolate_generate`) compare
what the student's model computes on inputs the grader chooses with what a correct model
computes for the same weights and tokens: its logits, the output of every stage Meta's
layer structure names (the embeddings, each layer's attention and feed-forward, each
layer's output) and its greedy continuations. Those values come from here, in the
grader's process, never from the worker: the seeded weights of the case files
(:func:`~grader.parts.part3.cases.make_weights`, checked against their digests) and
Meta's equations in float64 (RMSNorm, RoPE on consecutive pairs with or without Llama
3.2's frequency scaling, grouped-query attention, SwiGLU). ``tests/parts/part3/
test_reference.py`` checks them against the reference solution's stored logits and texts.

Without a cache every position is computed from the whole prefix, so these are the values
a cached model must give whatever the calls it is fed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.core.arrays import weights_digest
from grader.parts.part3.cases import make_weights


class ReferenceUnavailable(Exception):
    """The stored weights cannot be drawn again as they were (another NumPy stream)."""


def stage_names(n_layers: int) -> list[str]:
    """The stages compared, in the order a forward computes them."""
    names = ["embeddings"]
    for i in range(n_layers):
        names += [f"attention.{i}", f"feed_forward.{i}", f"layer.{i}"]
    return [*names, "logits"]


def stage_words(stage: str) -> str:
    """A stage as feedback names it ("layer 1's attention")."""
    kind, _, index = stage.partition(".")
    return {
        "embeddings": "the token embeddings (tok_embeddings)",
        "attention": f"layer {index}'s attention (layers[{index}].attention)",
        "feed_forward": f"layer {index}'s feed-forward (layers[{index}].feed_forward)",
        "layer": f"layer {index}'s output (layers[{index}], after both residual sums)",
        "logits": "the logits (the final norm and output projection)",
    }[kind]


def _scaled(freqs: np.ndarray) -> np.ndarray:
    """Llama 3.1/3.2's RoPE frequency scaling (Meta's ``apply_scaling``)."""
    scale, low, high, old = 32.0, 1.0, 4.0, 8192
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * freqs / scale + smooth * freqs
    return np.where(
        wavelen < old / high, freqs, np.where(wavelen > old / low, freqs / scale, blended)
    )


@dataclass
class ReferenceLlama:
    """Meta's Llama 3 forward on one model's weights, every position from the whole
    prefix (no cache), in float64."""

    params: dict[str, Any]
    weights: dict[str, np.ndarray]
    scaled_rope: bool = True

    @classmethod
    def of(cls, spec: dict[str, Any], scaled_rope: bool = True) -> ReferenceLlama:
        """The model a case file's ``models`` entry describes (params, vocab, seed): its
        weights drawn again and checked against the stored digest."""
        drawn = make_weights(spec["params"], spec["vocab_size"], spec["seed"])
        if "weights_sha256" in spec and weights_digest(drawn) != spec["weights_sha256"]:
            raise ReferenceUnavailable("the seeded weights differ from the stored ones")
        return cls(dict(spec["params"]), {k: v.astype(np.float64) for k, v in drawn.items()},
                   scaled_rope)  # fmt: skip

    def __post_init__(self) -> None:
        # Matrices kept transposed and contiguous: (B, T, in) @ (in, out) takes BLAS's path.
        self._t = {k: np.ascontiguousarray(v.T) for k, v in self.weights.items() if v.ndim == 2}

    @property
    def n_layers(self) -> int:
        return int(self.params["n_layers"])

    def _w(self, name: str) -> np.ndarray:
        return self.weights[name]

    def _mul(self, x: np.ndarray, name: str) -> np.ndarray:
        """``x`` (..., in) through the linear layer ``name`` (weights (out, in))."""
        return (x.reshape(-1, x.shape[-1]) @ self._t[name]).reshape(*x.shape[:-1], -1)

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        eps = float(self.params.get("norm_eps", 1e-5))
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * self._w(name)

    def _rotations(self, positions: int, head_dim: int) -> np.ndarray:
        theta = float(self.params.get("rope_theta", 500000.0))
        freqs = 1.0 / theta ** (np.arange(0, head_dim, 2)[: head_dim // 2] / head_dim)
        freqs = freqs.astype(np.float32).astype(np.float64)  # Meta's float32 frequencies
        if self.scaled_rope:
            freqs = _scaled(freqs)
        angles = np.outer(np.arange(positions, dtype=np.float64), freqs)
        return np.exp(1j * angles)  # (T, D/2)

    @staticmethod
    def _rotate(x: np.ndarray, rot: np.ndarray) -> np.ndarray:
        """Consecutive feature pairs of (B, T, H, D) rotated by (T, D/2)."""
        pairs = x.reshape(*x.shape[:-1], -1, 2)
        z = (pairs[..., 0] + 1j * pairs[..., 1]) * rot[None, :, None, :]
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)

    def _attention(
        self, x: np.ndarray, i: int, rot: np.ndarray, past: list[Any] | None = None
    ) -> np.ndarray:
        """Layer ``i``'s attention for ``x`` (B, T, dim) at the positions after ``past[i]``
        (the keys and values of the positions before, which it extends), or from 0."""
        p = self.params
        bsz, seqlen, dim = x.shape
        heads, kv_heads = int(p["n_heads"]), int(p.get("n_kv_heads") or p["n_heads"])
        head_dim = dim // heads
        pre = f"layers.{i}.attention."
        q = self._mul(x, pre + "wq.weight").reshape(bsz, seqlen, heads, head_dim)
        k = self._mul(x, pre + "wk.weight").reshape(bsz, seqlen, kv_heads, head_dim)
        v = self._mul(x, pre + "wv.weight").reshape(bsz, seqlen, kv_heads, head_dim)
        q, k = self._rotate(q, rot), self._rotate(k, rot)
        if past is not None:
            if past[i] is not None:
                k = np.concatenate([past[i][0], k], axis=1)
                v = np.concatenate([past[i][1], v], axis=1)
            past[i] = (k, v)
        start = k.shape[1] - seqlen
        rep = heads // kv_heads
        k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)  # head h uses h // rep
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, H, T, D)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim)
        scores = scores + np.triu(np.full((seqlen, start + seqlen), -np.inf), start + 1)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        out = (scores @ v).transpose(0, 2, 1, 3).reshape(bsz, seqlen, heads * head_dim)
        return self._mul(out, pre + "wo.weight")

    def _feed_forward(self, x: np.ndarray, i: int) -> np.ndarray:
        pre = f"layers.{i}.feed_forward."
        gate, up = self._mul(x, pre + "w1.weight"), self._mul(x, pre + "w3.weight")
        return self._mul(gate / (1 + np.exp(-gate)) * up, pre + "w2.weight")

    def stages(
        self, tokens: np.ndarray, last_only: bool = False, past: list[Any] | None = None
    ) -> dict[str, np.ndarray]:
        """Every stage's output for ``tokens`` (B, T) from position 0: (B, T, dim) each,
        and the logits (B, T, vocab), or (B, 1, vocab) of the last position alone. With
        ``past`` (one entry per layer, None at first), ``tokens`` follow the positions it
        holds, which it is extended by (:meth:`greedy`'s steps)."""
        ids = np.asarray(tokens, dtype=np.int64)
        h = self._w("tok_embeddings.weight")[ids]
        out = {"embeddings": h}
        head_dim = h.shape[-1] // int(self.params["n_heads"])
        start = 0 if past is None or past[0] is None else past[0][0].shape[1]
        rot = self._rotations(start + ids.shape[1], head_dim)[start:]
        for i in range(self.n_layers):
            normed = self._norm(h, f"layers.{i}.attention_norm.weight")
            attn = self._attention(normed, i, rot, past)
            h = h + attn
            ffn = self._feed_forward(self._norm(h, f"layers.{i}.ffn_norm.weight"), i)
            h = h + ffn
            out |= {f"attention.{i}": attn, f"feed_forward.{i}": ffn, f"layer.{i}": h}
        last = h[:, -1:] if last_only else h
        out["logits"] = self._mul(self._norm(last, "norm.weight"), "output.weight")
        return out

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        return self.stages(tokens)["logits"]

    # -------------------------------------------- one piece on the input it was given

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return self._w("tok_embeddings.weight")[np.asarray(tokens, dtype=np.int64)]

    def norm_on(self, x: np.ndarray, name: str) -> np.ndarray:
        """RMSNorm ``name`` ("layers.0.attention_norm", "norm") of ``x``."""
        return self._norm(np.asarray(x, dtype=np.float64), f"{name}.weight")

    def attention_on(self, i: int, x: np.ndarray) -> np.ndarray:
        """Layer ``i``'s attention of its inputs ``x`` (B, T, dim), every position from
        those before it: what a cached call's positions must give, whatever the calls."""
        x = np.asarray(x, dtype=np.float64)
        head_dim = x.shape[-1] // int(self.params["n_heads"])
        return self._attention(x, i, self._rotations(x.shape[1], head_dim))

    def feed_forward_on(self, i: int, x: np.ndarray) -> np.ndarray:
        return self._feed_forward(np.asarray(x, dtype=np.float64), i)

    def head(self, h: np.ndarray) -> np.ndarray:
        """The logits of the last layer's output ``h``: the final norm, then the output."""
        return self._mul(self.norm_on(h, "norm"), "output.weight")

    def greedy(self, prompt: list[int], new: int, max_seq_len: int) -> list[int]:
        """``prompt`` continued by up to ``new`` greedy tokens (none past ``max_seq_len``
        positions), stop tokens included: a row of Meta's generate at temperature 0."""
        seq = list(prompt)
        past: list[Any] = [None] * self.n_layers
        fed = np.array([seq])
        while len(seq) < min(max_seq_len, len(prompt) + new):
            logits = self.stages(fed, last_only=True, past=past)["logits"]
            seq.append(int(np.argmax(logits)))
            fed = np.array([[seq[-1]]])
        return seq
