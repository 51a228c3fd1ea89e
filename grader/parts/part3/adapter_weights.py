"""Part 3's seeded weights (the worker's module ``adapter_part3_weights``): a Meta
checkpoint's tensors, by key, and the normal draw each is made from.

The grader draws the stored models' weights with numpy (``cases.make_weights``: the same
arrays in every process, checked against their digests). A GPU workload's model (check
3.11's, with a profile's sizes) is drawn by the worker itself, on the grading device
(:func:`draw_on`): its prompts are built there in the grading, so no stored answer needs
numpy's values, and its weights need neither the grader's draw nor the request's bytes.
"""

from __future__ import annotations

import math
from typing import Any


def ffn_hidden(params: dict[str, Any]) -> int:
    """SwiGLU hidden size by Meta's rule (2/3 of 4·dim, scaled, rounded up)."""
    hidden = int(2 * 4 * params["dim"] / 3)
    if params.get("ffn_dim_multiplier") is not None:
        hidden = int(params["ffn_dim_multiplier"] * hidden)
    m = params["multiple_of"]
    return m * ((hidden + m - 1) // m)


def checkpoint_shapes(params: dict[str, Any], vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Meta checkpoint, by key, with its shape."""
    d, h = params["dim"], ffn_hidden(params)
    head_dim = d // params["n_heads"]
    kv = params["n_kv_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (vocab, d)}
    for i in range(params["n_layers"]):
        p = f"layers.{i}."
        shapes[f"{p}attention.wq.weight"] = (d, d)
        shapes[f"{p}attention.wk.weight"] = (kv, d)
        shapes[f"{p}attention.wv.weight"] = (kv, d)
        shapes[f"{p}attention.wo.weight"] = (d, d)
        shapes[f"{p}feed_forward.w1.weight"] = (h, d)
        shapes[f"{p}feed_forward.w2.weight"] = (d, h)
        shapes[f"{p}feed_forward.w3.weight"] = (h, d)
        shapes[f"{p}attention_norm.weight"] = (d,)
        shapes[f"{p}ffn_norm.weight"] = (d,)
    shapes["norm.weight"] = (d,)
    shapes["output.weight"] = (vocab, d)
    return shapes


def weight_scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """The mean and standard deviation of tensor ``name``'s normal draw: norms near one,
    the embedding unit normal, each matrix scaled by its fan-in, the query and key
    projections and the output wider (sharp attention, spread logits)."""
    if name.endswith("norm.weight"):
        return 1.0, 0.1
    if name == "tok_embeddings.weight":
        return 0.0, 1.0
    gain = 1.5 if (".wq." in name or ".wk." in name) else 1.0
    gain = 2.0 if name == "output.weight" else gain
    return 0.0, gain / math.sqrt(shape[1])


def draw_on(params: dict[str, Any], vocab: int, seed: int, device: str) -> dict[str, Any]:
    """The float32 weights of a checkpoint of ``params`` and ``vocab``, drawn from
    ``seed`` by torch on ``device`` (the scales of :func:`weight_scale`): the same in every
    process on that device, though not numpy's values."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in checkpoint_shapes(params, vocab).items():
        mean, std = weight_scale(name, shape)
        drawn = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        weights[name] = drawn.mul_(std).add_(mean)
    return weights
