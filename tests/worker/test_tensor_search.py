"""The worker's search for the tensors a submission keeps (Parts 2 and 3 use it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grader.worker.tensor_search import CACHE_DEPTH, MAX_ITEMS, tensors_in


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
