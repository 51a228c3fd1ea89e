"""The worker's search for the tensors a submission keeps (Parts 2 and 3 use it): inside
what forward hands back, and wherever the model can reach them at its next call."""

from __future__ import annotations

import collections
import functools
import sys
import textwrap
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from grader.ta.regen import import_path
from grader.worker.tensor_search import (
    MAX_ITEMS,
    MAX_VISITS,
    held_tensors,
    own_globals,
    reachable,
    tensors_in,
)


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
        collections.deque([k, v]),
        [LayerCache({"layers": [[{"k": k, "v": v}]]}, None)],  # six containers deep
        np.array([k, v, None], dtype=object),
        [weakref.ref(k), weakref.ref(v)],
    ]
    for past in layouts:
        found = tensors_in(past)
        assert len(found) == 2 and found[0] is k and found[1] is v, past


def test_depth_is_unbounded_but_visits_are_bounded_and_cycles_end() -> None:
    k = torch.zeros(1, 4, 8)
    deep: Any = k
    for _ in range(100):  # far past the four containers the search once stopped at
        deep = [deep]
    assert tensors_in(deep) == [k]
    endless: list[Any] = [k]
    endless.append(endless)  # a cycle: visited once
    assert tensors_in(endless) == [k]
    chain: Any = k
    for _ in range(MAX_VISITS):  # a chain longer than the visits allowed: cut off
        chain = [chain]
    assert tensors_in(chain) == []


def test_modules_tables_and_weights_bound_what_forward_hands_back() -> None:
    k = torch.zeros(1, 4, 8)
    assert tensors_in(nn.Linear(8, 8)) == []  # a module is not searched (its weights)
    assert tensors_in([nn.Parameter(torch.zeros(1, 4, 8))]) == []
    assert tensors_in([k] * (MAX_ITEMS + 1)) == []  # a table, not a cache
    assert tensors_in([None, "text", 3]) == []


def test_closures_partials_and_lru_caches_are_searched() -> None:
    k, v = torch.zeros(1, 4, 8), torch.ones(1, 4, 8)

    def keeper() -> Any:
        kept = [k]
        return lambda: kept

    @functools.lru_cache(maxsize=8)  # bounded: its results sit in a linked list
    def store(layer: int) -> dict[str, torch.Tensor]:
        return {"v": v}

    store(0)
    unbounded = functools.cache(lambda layer: [k])
    unbounded(1)
    assert tensors_in(unbounded) == [k]
    assert tensors_in(keeper()) == [k]  # a function's closure cell
    assert tensors_in(functools.partial(print, k)) == [k]  # a partial's arguments
    assert tensors_in(store) == [v]  # what the lru_cache keeps
    assert tensors_in(functools.partial(keeper(), store)) == [k, v]


#: A module-level container, one of the places a model may keep its cache.
MODULE_LEVEL: dict[str, torch.Tensor] = {}


class Keeper(nn.Module):
    """Keeps a tensor in every place on the model :func:`held_tensors` searches, and its
    weights."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8, bias=False)
        self.inner = nn.Module()
        self.inner.cache = torch.zeros(1, 4, 8)  # an attribute of a submodule
        self.inner.register_buffer("buf", torch.zeros(1, 4, 8), persistent=False)
        self.pairs = [LayerCache(torch.zeros(1, 4, 8), torch.zeros(1, 4, 8))]  # a container
        kept = {"k": torch.zeros(1, 4, 8)}
        self.inner.lookup = lambda: kept  # in a closure
        default = torch.zeros(1, 4, 8)
        self.readers = [(lambda held=default: held)]  # a default, in a list
        self.stream = collections.deque([torch.zeros(1, 4, 8)])
        self.by_layer: Any = weakref.WeakKeyDictionary({self.inner: (torch.zeros(1, 4, 8),)})
        self.weight_t = self.proj.weight.t()  # the weights' memory, transposed
        self.again = self.inner.cache  # the same tensor twice
        self.self_ref = [self]  # a cycle back to the model

    def expected(self) -> list[torch.Tensor]:
        return [
            self.inner.cache,
            self.inner.buf,
            self.pairs[0].keys,
            self.pairs[0].values,
            self.inner.lookup()["k"],
            self.readers[0](),
            self.stream[0],
            self.by_layer[self.inner][0],
        ]


def test_held_tensors_reach_every_place_a_model_keeps_a_tensor() -> None:
    model = Keeper()
    found = [id(t) for t in held_tensors(model)]
    assert len(found) == len(set(found))  # each once
    assert set(found) >= {id(t) for t in model.expected()}


def test_held_tensors_leave_out_the_weights() -> None:
    model = Keeper()
    found = held_tensors(model)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert all(t.untyped_storage().data_ptr() not in weights for t in found)
    assert not any(isinstance(t, nn.Parameter) for t in found)


# ------------------------------------------------ the globals of the submission's modules

MODEL_FILE = """
import functools

import torch
from torch import nn

import kv_store

LOCAL: dict = {}


def remembered(method):
    kept: dict = {}

    @functools.wraps(method)
    def wrapper(self, t):
        kept["t"] = t
        return method(self, t)

    return wrapper


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    @remembered
    def keep(self, t):
        return t

    def forward(self, x):
        kv_store.STORE["k"] = x
        LOCAL["v"] = x + 1
        self.keep(x + 2)
        return x
"""


@pytest.fixture
def submitted(tmp_path: Path) -> Iterator[Any]:
    """A model whose file, in a folder of its own as a submission's, keeps one tensor in
    its own globals, one in a decorator's closure on its class, and one in the globals of
    a helper module beside it (``kv_store.py``), after one call."""
    (tmp_path / "kv_store.py").write_text("STORE: dict = {}\n")
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL_FILE))
    sys.path.insert(0, str(tmp_path))
    try:
        module = import_path(tmp_path / "model.py", "submitted_model")
        model = module.Model()
        model(torch.zeros(1, 4, 8))
        yield model
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kv_store", None)


def test_the_globals_of_the_submissions_own_modules_are_searched(submitted: Any) -> None:
    namespaces = own_globals(submitted)
    names = {ns.get("__name__") for ns in namespaces}
    assert names == {"submitted_model", "kv_store"}  # neither torch's nor this test's
    kv_store = sys.modules["kv_store"]
    held = reachable(submitted)
    owners = {owner: [t for _, t in found] for owner, found in held.items()}
    assert any(t is kv_store.STORE["k"] for t in owners["kv_store.STORE"])
    assert any(
        t is submitted.forward.__globals__["LOCAL"]["v"] for t in owners["submitted_model.LOCAL"]
    )
    assert len(owners["submitted_model.Model"]) == 1  # in the closure of the class's method
    assert {id(t) for t in held_tensors(submitted)} == {
        id(t) for ts in owners.values() for t in ts if not isinstance(t, nn.Parameter)
    }


def test_a_model_defined_in_a_library_or_this_process_reaches_no_library_module() -> None:
    names = {ns.get("__name__") for ns in own_globals(nn.Linear(2, 2))}
    assert names == set()  # torch's own class: its modules are a library's
    mine = {ns.get("__name__") for ns in own_globals(Keeper())}
    assert "torch" not in mine and not any(str(n).startswith("numpy") for n in mine)


def test_parameters_are_found_for_callers_to_judge() -> None:
    """A parameter list may hold a cache (made at prefill time): the search reports
    parameters with the rest; held_tensors, as the weights are, leaves them out."""
    model = nn.Module()
    model.slots = nn.ParameterList([nn.Parameter(torch.zeros(1, 4, 8), requires_grad=False)])
    held = reachable(model)
    assert [t for _, t in held["slots"]] == [model.slots[0]]
    assert held_tensors(model) == []


class Resists:
    """An object whose attributes cannot be read: its ``__dict__`` raises."""

    @property
    def __dict__(self) -> Any:  # type: ignore[override]
        raise RuntimeError("not today")


def test_an_object_that_resists_being_looked_into_is_passed_over() -> None:
    k = torch.zeros(1, 4, 8)
    assert tensors_in([Resists(), k]) == [k]
