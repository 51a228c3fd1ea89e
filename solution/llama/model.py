"""Part 3: Meta's Llama 3 architecture with a switchable KV cache.

The layers follow Meta's reference code (RMSNorm, rotary embeddings with the
Llama 3.1/3.2 frequency scaling, grouped-query attention, SwiGLU), without
fairscale and without hard-coded ``.cuda()`` calls, so the same model runs on
a CPU or a GPU. State-dict keys are Meta's, so a real ``consolidated.00.pth``
loads unchanged.

With ``kv_caching`` on, every attention layer keeps preallocated ``cache_k``
and ``cache_v`` of shape (max_batch_size, max_seq_len, n_kv_heads, head_dim)
and a call at ``start_pos`` writes its keys and values at
``[:bsz, start_pos : start_pos + seqlen]``. With it off there is no cache at
all: each call attends over exactly the tokens it is given.
"""

# BEGIN PROMPT
# # Fill in every TODO; keep the class, attribute and method names and the
# # signatures: the autograder builds this model from Meta's checkpoint layout and
# # calls ``forward`` and ``generate`` directly. Everything not about the cache
# # (RMSNorm, RoPE, repeat_kv, the blocks, loading) is already written.
# END PROMPT

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from llama.generation import Generation
from llama.tokenizer import Tokenizer


@dataclass
class ModelArgs:
    dim: int = 4096  # width of the residual stream
    n_layers: int = 32  # transformer blocks
    n_heads: int = 32  # query heads
    n_kv_heads: int | None = None  # key/value heads (GQA); None means n_heads
    vocab_size: int = -1  # set from the tokenizer by Llama.build
    multiple_of: int = 256  # the SwiGLU hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None  # scales the SwiGLU hidden size
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 500000.0  # RoPE base frequency
    use_scaled_rope: bool = False  # Llama 3.1/3.2 long-context frequency scaling
    max_batch_size: int = 32  # rows of the preallocated KV cache
    max_seq_len: int = 2048  # positions of the preallocated KV cache and of RoPE
    kv_caching: bool = True  # allocate and use the KV cache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 for stability, then return to the input's dtype.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


# ---------------------------------------------------------------- rotary embeddings


def apply_scaling(freqs: torch.Tensor) -> torch.Tensor:
    """Llama 3.1/3.2 RoPE scaling: slow down low frequencies, keep high ones."""
    scale_factor, low_freq_factor, high_freq_factor = 32.0, 1.0, 4.0
    old_context_len = 8192  # the original Llama 3 context
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / freqs
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * freqs / scale_factor + smooth * freqs
    return torch.where(
        wavelen < high_freq_wavelen,
        freqs,
        torch.where(wavelen > low_freq_wavelen, freqs / scale_factor, blended),
    )


def precompute_freqs_cis(
    dim: int, end: int, theta: float = 10000.0, use_scaled: bool = False
) -> torch.Tensor:
    """Complex rotations e^{i·pos·freq} for every position < end: (end, dim // 2)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    if use_scaled:
        freqs = apply_scaling(freqs)
    t = torch.arange(end, dtype=torch.float32)
    angles = torch.outer(t, freqs)  # (end, dim // 2)
    return torch.polar(torch.ones_like(angles), angles)


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(T, D/2) -> (1, T, 1, D/2) so it broadcasts against (B, T, H, D/2)."""
    assert freqs_cis.shape == (x.shape[1], x.shape[-1]), (freqs_cis.shape, x.shape)
    shape = [d if i in (1, x.ndim - 1) else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate consecutive pairs of q and k features by their position's angles."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))  # (B, T, H, D/2)
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))  # (B, T, Hkv, D/2)
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)  # (B, T, H, D)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)  # (B, T, Hkv, D)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, T, Hkv, D) -> (B, T, Hkv * n_rep, D): each KV head serves n_rep query heads."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    expanded = x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim)
    return expanded.reshape(bs, slen, n_kv_heads * n_rep, head_dim)


# ------------------------------------------------------------------------- blocks


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, args.dim, bias=False)
        self.max_batch_size = args.max_batch_size
        self.max_seq_len = args.max_seq_len
        self.kv_caching = args.kv_caching
        self.cache_k: torch.Tensor | None = None
        self.cache_v: torch.Tensor | None = None

    def _cache_shape(self) -> tuple[int, int, int, int]:
        return (self.max_batch_size, self.max_seq_len, self.n_kv_heads, self.head_dim)

    def forward(
        self,
        x: torch.Tensor,
        start_pos: int,
        freqs_cis: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)  # (B, T, H, D)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

        # BEGIN SOLUTION
        if self.kv_caching:
            if self.cache_k is None or self.cache_k.shape != self._cache_shape():
                self.cache_k = torch.zeros(self._cache_shape(), dtype=xk.dtype, device=xk.device)
                self.cache_v = torch.zeros(self._cache_shape(), dtype=xv.dtype, device=xv.device)
            self.cache_k = self.cache_k.to(xk)
            self.cache_v = self.cache_v.to(xv)
            self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
            self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)
            values = self.cache_v[:bsz, : start_pos + seqlen]
        else:
            keys, values = xk, xv  # (B, T, Hkv, D): the call holds the whole prefix
        # END SOLUTION
        # BEGIN PROMPT
        # # TODO 1: set `keys` and `values`, each (B, T_total, Hkv, D), in place of the
        # #   placeholders below, and delete the raise.
        # #   With the cache on (self.kv_caching):
        # #     1. If self.cache_k is None (or not of self._cache_shape()), allocate
        # #        self.cache_k and self.cache_v: torch.zeros of shape
        # #        (max_batch_size, max_seq_len, n_kv_heads, head_dim) with xk's dtype and
        # #        device (never .cuda(): the model must also run on a CPU); if the
        # #        cache exists, move it with .to(xk) in case the model changed device.
        # #     2. Write this call's xk and xv at [:bsz, start_pos : start_pos + seqlen].
        # #     3. Read keys and values back from [:bsz, : start_pos + seqlen]: the cached
        # #        prefix and the new tokens, so T_total = start_pos + seqlen.
        # #   With the cache off there is no cache at all: the caller passed the whole
        # #   prefix (start_pos is 0), so keys and values are xk and xv (T_total = seqlen).
        # keys = values = None  # placeholders
        # raise NotImplementedError("Attention.forward: KV cache (see TODO)")
        # END PROMPT

        keys = repeat_kv(keys, self.n_rep)  # (B, T_total, H, D)
        values = repeat_kv(values, self.n_rep)
        xq = xq.transpose(1, 2)  # (B, H, T, D)
        keys = keys.transpose(1, 2)  # (B, H, T_total, D)
        values = values.transpose(1, 2)
        scores = xq @ keys.transpose(2, 3) / math.sqrt(self.head_dim)  # (B, H, T, T_total)
        if mask is not None:
            scores = scores + mask
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = scores @ values  # (B, H, T, D)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)  # (B, T, H * D)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(
        self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float | None
    ) -> None:
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)  # gate
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)  # down
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args)
        self.feed_forward = FeedForward(
            args.dim, 4 * args.dim, args.multiple_of, args.ffn_dim_multiplier
        )
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(
        self, x: torch.Tensor, start_pos: int, freqs_cis: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
        return h + self.feed_forward(self.ffn_norm(h))


# -------------------------------------------------------------------------- model


def causal_mask(seqlen: int, start_pos: int, device: torch.device) -> torch.Tensor | None:
    """Additive mask (T, start_pos + T): new token i sees positions 0 .. start_pos + i.

    One new token may see everything before it, so it needs no mask at all.
    """
    # BEGIN SOLUTION
    if seqlen <= 1:
        return None
    mask = torch.full((seqlen, seqlen), float("-inf"), device=device).triu(1)  # (T, T)
    history = torch.zeros((seqlen, start_pos), device=device)  # the cached prefix: all visible
    return torch.hstack([history, mask])  # (T, start_pos + T)
    # END SOLUTION
    # BEGIN PROMPT
    # # TODO 2:
    # #   1. If seqlen <= 1, return None (one new token sees every position so far).
    # #   2. Build the (T, T) mask of the new tokens on `device`: -inf above the
    # #      diagonal, 0 on and below it (hint: torch.full(..., float("-inf")).triu(1)).
    # #   3. Put a (T, start_pos) block of zeros in front of it (torch.hstack): the
    # #      cached prefix is visible to every new token. The result is
    # #      (T, start_pos + T); without the cache start_pos is 0 and this is the
    # #      usual causal mask.
    # raise NotImplementedError("causal_mask: the (T, start_pos + T) additive mask (see TODO)")
    # END PROMPT


class Llama(Generation, nn.Module):
    """The Llama 3 decoder; ``generate`` comes from :class:`Generation`."""

    def __init__(self, params: ModelArgs) -> None:
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.n_layers = params.n_layers
        self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, params) for i in range(params.n_layers))
        self.norm = RMSNorm(params.dim, eps=params.norm_eps)
        self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
        # RoPE covers twice max_seq_len, as in Meta's code. A plain attribute, not a
        # buffer: model.to(torch.bfloat16) must not cast these complex numbers.
        self.freqs_cis = precompute_freqs_cis(
            params.dim // params.n_heads,
            params.max_seq_len * 2,
            params.rope_theta,
            params.use_scaled_rope,
        )

    def set_kv_caching(self, enabled: bool) -> None:
        """Switch every attention layer's cache on or off (off frees it)."""
        # BEGIN SOLUTION
        self.params.kv_caching = enabled
        for layer in self.layers:
            layer.attention.kv_caching = enabled
            if not enabled:
                layer.attention.cache_k = layer.attention.cache_v = None
        # END SOLUTION
        # BEGIN PROMPT
        # # TODO 3:
        # #   1. Record the switch in self.params.kv_caching.
        # #   2. For every layer in self.layers, set layer.attention.kv_caching = enabled.
        # #   3. When switching off, drop the layer's cache (cache_k = cache_v = None) so
        # #      its memory is freed; with it on, Attention.forward allocates it lazily.
        # raise NotImplementedError("Llama.set_kv_caching: switch every layer's cache (see TODO)")
        # END PROMPT

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Logits (B, T, vocab) for ``tokens`` (B, T) sitting at positions start_pos ...

        With the cache, positions before start_pos come from the cache; without it
        the caller passes the whole prefix and start_pos is 0.
        """
        _bsz, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)  # (B, T, dim)
        self.freqs_cis = self.freqs_cis.to(h.device)
        freqs_cis = self.freqs_cis[start_pos : start_pos + seqlen]  # (T, head_dim / 2)
        mask = causal_mask(seqlen, start_pos, tokens.device)
        if mask is not None:
            mask = mask.type_as(h)
        for layer in self.layers:
            h = layer(h, start_pos, freqs_cis, mask)
        return self.output(self.norm(h)).float()  # (B, T, vocab)

    @staticmethod
    def build(
        ckpt_dir: str | Path,
        tokenizer_path: str | Path,
        max_seq_len: int,
        max_batch_size: int,
        device: str = "cpu",
        kv_caching: bool = True,
        dtype: torch.dtype | None = None,
    ) -> tuple[Llama, Tokenizer]:
        """Load a checkpoint in Meta's layout: params.json, consolidated.00.pth, tokenizer.model.

        Weights keep the checkpoint's dtype unless ``dtype`` is given (bf16 real
        weights are best run as float32 on a CPU).
        """
        ckpt_dir = Path(ckpt_dir)
        for name in ("params.json", "consolidated.00.pth"):
            if not (ckpt_dir / name).is_file():
                raise FileNotFoundError(f"{ckpt_dir / name} is missing (Meta's checkpoint layout)")
        params = json.loads((ckpt_dir / "params.json").read_text())
        known = {f.name for f in fields(ModelArgs)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"params.json has keys ModelArgs does not know: {', '.join(unknown)}")
        tokenizer = Tokenizer(str(tokenizer_path))
        args = ModelArgs(
            **params, max_seq_len=max_seq_len, max_batch_size=max_batch_size, kv_caching=kv_caching
        )
        args.vocab_size = tokenizer.n_words
        checkpoint = torch.load(
            ckpt_dir / "consolidated.00.pth", map_location="cpu", weights_only=True
        )
        model = Llama(args)
        load_checkpoint(model, checkpoint)
        if dtype is not None:
            model = model.to(dtype)
        return model.to(device).eval(), tokenizer


def load_checkpoint(model: nn.Module, checkpoint: dict[str, torch.Tensor]) -> None:
    """Strict load that names missing, unexpected and mis-shaped tensors."""
    own = model.state_dict()
    checkpoint = {k: v for k, v in checkpoint.items() if k != "rope.freqs"}  # Meta ships it
    missing = sorted(set(own) - set(checkpoint))
    unexpected = sorted(set(checkpoint) - set(own))
    wrong = [
        f"{k}: checkpoint {tuple(v.shape)}, model {tuple(own[k].shape)}"
        for k, v in checkpoint.items()
        if k in own and v.shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        problems = []
        if missing:
            problems.append(f"missing from the checkpoint: {', '.join(missing[:5])}")
        if unexpected:
            problems.append(f"not in the model: {', '.join(unexpected[:5])}")
        if wrong:
            problems.append(f"shape mismatch: {'; '.join(wrong[:5])}")
        raise ValueError("checkpoint does not fit the model: " + " | ".join(problems))
    model.load_state_dict(checkpoint, strict=True)
