"""grader/parts/part3/adapter_weights.py: a Meta checkpoint's tensors, the scale each is
drawn at, and the worker's own draw of a GPU workload's model."""

from __future__ import annotations

import torch

from grader.parts.part3.adapter_weights import checkpoint_shapes, draw_on, weight_scale
from grader.parts.part3.cases import make_weights
from tests.conftest import assert_drawn_at_scales

PARAMS = {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "multiple_of": 32}
VOCAB = 1000


def test_the_device_draw_is_the_same_in_every_process() -> None:
    first, again = draw_on(PARAMS, VOCAB, 5, "cpu"), draw_on(PARAMS, VOCAB, 5, "cpu")
    assert {k: tuple(v.shape) for k, v in first.items()} == checkpoint_shapes(PARAMS, VOCAB)
    assert all(v.dtype == torch.float32 and torch.equal(v, again[k]) for k, v in first.items())
    other = draw_on(PARAMS, VOCAB, 6, "cpu")
    assert not torch.equal(first["output.weight"], other["output.weight"])


def test_both_draws_give_each_tensor_its_scale() -> None:
    drawn = {
        "numpy": make_weights(PARAMS, VOCAB, 2),
        "torch": {k: v.numpy() for k, v in draw_on(PARAMS, VOCAB, 2, "cpu").items()},
    }
    assert_drawn_at_scales(drawn, checkpoint_shapes(PARAMS, VOCAB), weight_scale)
    assert weight_scale("layers.0.attention.wk.weight", (64, 128)) == (0.0, 1.5 / 128**0.5)
    assert weight_scale("output.weight", (VOCAB, 128)) == (0.0, 2.0 / 128**0.5)
    assert weight_scale("layers.1.ffn_norm.weight", (128,)) == (1.0, 0.1)
