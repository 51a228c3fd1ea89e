"""The worker's search for the tensors a submission keeps (Parts 2 and 3 use it): inside
what forward hands back, and wherever the model itself keeps them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grader.worker.tensor_search import CACHE_DEPTH, MAX_ITEMS, held_tensors, tensors_in


@dataclass
class LayerCache:
    keys: torch.Tensor
    values: torch.Tensor


def test_every_honest_layout_of_a_cache_is_searched() -> None:
    k, v = torch.zeros(1, 4, 8), torch.ones(1, 4, 8)
    layouts: list[Any] = [
        [(k, v)],
        {"layer0": (k, v)},
        (LayerCache(k, v),),
        [[k, v]],
    ]
    for past in layouts:
        found = tensors_in(past)
        assert len(found) == 2 and found[0] is k and found[1] is v, past


def test_modules_tables_and_depth_bound_the_search() -> None:
    k = torch.zeros(1, 4, 8)
    assert tensors_in(nn.Linear(8, 8)) == []  # a module is not searched (its weights)
    assert tensors_in([k] * (MAX_ITEMS + 1)) == []  # a table, not a cache
    deep: Any = k
    for _ in range(CACHE_DEPTH):
        deep = [deep]
    assert tensors_in(deep) == [k]
    assert tensors_in([deep]) == []  # one level past the limit
    assert tensors_in([None, "text", 3]) == []


#: A module-level container, one of the places a model may keep its cache.
MODULE_LEVEL: dict[str, torch.Tensor] = {}


class Keeper(nn.Module):
    """Keeps a tensor in every place :func:`held_tensors` searches, and its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8, bias=False)
        self.inner = nn.Module()
        self.inner.cache = torch.zeros(1, 4, 8)  # an attribute of a submodule
        self.inner.register_buffer("buf", torch.zeros(1, 4, 8), persistent=False)
        self.pairs = [LayerCache(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))]  # a container
        kept = {"k": torch.zeros(1, 4, 8)}
        self.inner.lookup = lambda: kept  # in a closure
        self.weight_t = self.proj.weight.t()  # the weights' memory, transposed
        self.again = self.inner.cache  # the same tensor twice


def test_held_tensors_reach_every_place_a_model_keeps_a_tensor() -> None:
    model = Keeper()
    MODULE_LEVEL["k"] = torch.zeros(1, 4, 8)
    try:
        found = {id(t) for t in held_tensors(model)}
        expected = [
            model.inner.cache,
            model.inner.buf,
            model.pairs[0].keys,
            model.pairs[0].values,
            model.inner.lookup()["k"],
            MODULE_LEVEL["k"],
        ]
        assert found == {id(t) for t in expected}  # each once
    finally:
        MODULE_LEVEL.clear()


def test_held_tensors_leave_out_the_weights() -> None:
    model = Keeper()
    found = held_tensors(model)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert all(t.untyped_storage().data_ptr() not in weights for t in found)
    assert not any(isinstance(t, nn.Parameter) for t in found)
