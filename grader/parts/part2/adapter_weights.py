"""Part 2's seeded weights (the worker's module ``adapter_part2_weights``): the course
model's parameters, by state-dict key, and the normal draw each is made from.

The grader draws the stored models' weights with numpy (``cases.make_state_dict``: the
same arrays in every process, checked against their digests). A GPU workload's benchmark
model (``bench_model`` with a profile's sizes) is drawn by the worker itself, on the
grading device (:func:`draw_on`): its prompts are built there in the grading, so no
stored answer needs numpy's values, and its 1.6 GB took a core about 9 s to draw and
the request about 10 s to carry.
"""

from __future__ import annotations

import math
from typing import Any

#: The attention's query and key projections and the output projection are drawn wider:
#: sharp attention and spread logits, so that mistakes show.
GAINS = {"W_q": 1.5, "W_k": 1.5, "output_projection": 2.0}


def state_dict_shapes(config: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Every parameter of the course model, by state-dict key, with its shape.

    The attention projections have no bias (the course's weight file has none,
    for W_o neither); everything else that is linear or a norm has one.
    """
    v, d, f = config["vocab_size"], config["d_model"], config["d_ff"]
    shapes: dict[str, tuple[int, ...]] = {
        "token_embedding.weight": (v, d),
        "pos_embedding.weight": (config["max_seq_len"], d),
    }
    for i in range(config["num_layers"]):
        p = f"layers.{i}."
        for name in ("W_q", "W_k", "W_v", "W_o"):
            shapes[f"{p}attention.{name}.weight"] = (d, d)
        shapes[f"{p}feed_forward.fc1.weight"] = (f, d)
        shapes[f"{p}feed_forward.fc1.bias"] = (f,)
        shapes[f"{p}feed_forward.fc2.weight"] = (d, f)
        shapes[f"{p}feed_forward.fc2.bias"] = (d,)
        for norm in ("norm1", "norm2"):
            shapes[f"{p}{norm}.weight"] = (d,)
            shapes[f"{p}{norm}.bias"] = (d,)
    shapes["norm.weight"] = (d,)
    shapes["norm.bias"] = (d,)
    shapes["output_projection.weight"] = (v, d)
    shapes["output_projection.bias"] = (v,)
    return shapes


def weight_scale(name: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """The mean and standard deviation of parameter ``name``'s normal draw: embeddings
    unit normal, norms near one (weights) or zero (biases), other biases small, and each
    matrix scaled by its fan-in."""
    if name.endswith("embedding.weight"):
        return 0.0, 1.0
    if ".norm" in name or name.startswith("norm."):
        return (1.0 if name.endswith("weight") else 0.0), 0.1
    if name.endswith("bias"):
        return 0.0, 0.1
    gain = next((g for key, g in GAINS.items() if key in name), 1.0)
    return 0.0, gain / math.sqrt(shape[1])


def draw_on(config: dict[str, int], seed: int, device: str) -> dict[str, Any]:
    """The float32 weights of the course model ``config``, drawn from ``seed`` by torch on
    ``device`` (the scales of :func:`weight_scale`): the same in every process on that
    device, though not numpy's values."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, shape in state_dict_shapes(config).items():
        mean, std = weight_scale(name, shape)
        drawn = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        weights[name] = drawn.mul_(std).add_(mean)
    return weights
