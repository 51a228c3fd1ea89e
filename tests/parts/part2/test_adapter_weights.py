"""grader/parts/part2/adapter_weights.py: the course model's parameters, the scale each is
drawn at, and the worker's own draw of a GPU workload's benchmark model."""

from __future__ import annotations

import torch

from grader.parts.part2.adapter_weights import draw_on, state_dict_shapes, weight_scale
from grader.parts.part2.cases import PUBLIC_MODEL, bench_model, load_header, make_state_dict
from tests.conftest import assert_drawn_at_scales

CONFIG = {"vocab_size": 1000, "d_model": 128, "d_ff": 512, "num_layers": 2, "max_seq_len": 256}


def test_the_device_draw_is_the_same_in_every_process() -> None:
    first, again = draw_on(CONFIG, 7, "cpu"), draw_on(CONFIG, 7, "cpu")
    assert {k: tuple(v.shape) for k, v in first.items()} == state_dict_shapes(CONFIG)
    assert all(v.dtype == torch.float32 and torch.equal(v, again[k]) for k, v in first.items())
    other = draw_on(CONFIG, 8, "cpu")
    assert not torch.equal(first["token_embedding.weight"], other["token_embedding.weight"])


def test_both_draws_give_each_parameter_its_scale() -> None:
    """numpy's (the stored models') and torch's (a GPU workload's) draw each parameter at
    the same mean and spread: the same kind of model, whichever drew it."""
    drawn = {
        "numpy": make_state_dict({"config": CONFIG, "seed": 3}),
        "torch": {k: v.numpy() for k, v in draw_on(CONFIG, 3, "cpu").items()},
    }
    assert_drawn_at_scales(drawn, state_dict_shapes(CONFIG), weight_scale)
    assert weight_scale("layers.0.attention.W_q.weight", (128, 128)) == (0.0, 1.5 / 128**0.5)
    assert weight_scale("layers.1.norm2.weight", (128,)) == (1.0, 0.1)


def test_a_profiles_benchmark_model_is_drawn_by_the_worker() -> None:
    own = bench_model(PUBLIC_MODEL, 300, {"d_model": 48})
    assert own["on_device"] is True and own["config"]["d_model"] == 48
    assert load_header("bench", own) == {
        "op": "load", "model": "bench", "config": own["config"], "seed": own["seed"],
        "on_device": True,
    }  # fmt: skip
    public_sized = bench_model(PUBLIC_MODEL, 300)  # the cpu profile's: sent by the grader
    assert "on_device" not in public_sized
    assert load_header("bench", public_sized) == {
        "op": "load", "model": "bench", "config": public_sized["config"]
    }  # fmt: skip
