"""Finding the tensors a submission keeps (worker side): its cache, wherever it lives.

An honest cache may be a list of pairs, a dict, a dataclass or a tuple of tuples; the
adapters look inside each of them the same way, to the same depth (:func:`tensors_in`).
It may also live outside what forward hands back: on a layer, in a closure, in a
module-level container (:func:`held_tensors`, for the probes that must reach the tensors
the next call reads).
"""

from __future__ import annotations

from typing import Any

#: How deep lists, tuples, dicts and plain objects are searched for tensors.
CACHE_DEPTH = 4
#: A container with more items than this is a table (a tokenizer's), not a cache.
MAX_ITEMS = 4096


def tensors_in(value: Any, depth: int = 0) -> list[Any]:
    """Every tensor in ``value``: itself, or inside its lists, tuples, dicts and plain
    objects (a cache dataclass, say), not inside callables (modules) or large tables."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple, dict)):
        items = list(value.values() if isinstance(value, dict) else value)
    elif hasattr(value, "__dict__") and not callable(value):
        items = list(vars(value).values())
    else:
        return []
    if depth >= CACHE_DEPTH or len(items) > MAX_ITEMS:
        return []
    return [t for item in items for t in tensors_in(item, depth + 1)]


def _closure_values(value: Any) -> list[Any]:
    """What a function (or a bound method) held as an attribute keeps in its closure."""
    import types

    func = value.__func__ if isinstance(value, types.MethodType) else value
    if not isinstance(func, types.FunctionType) or not func.__closure__:
        return []
    kept = []
    for cell in func.__closure__:
        try:
            kept.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            continue
    return kept


def _global_values(model: Any) -> list[Any]:
    """The tensors and containers among the globals of the module that defines
    ``model``'s class (a cache kept in a module-level list or dict), not imported modules,
    classes, functions or the module's own dunder entries (its builtins)."""
    import sys

    import torch

    source = sys.modules.get(type(model).__module__)
    kinds = (torch.Tensor, list, tuple, dict)
    if source is None:
        return []
    return [v for k, v in vars(source).items() if not k.startswith("__") and isinstance(v, kinds)]


def _memory(tensor: Any) -> int | None:
    """Where ``tensor``'s memory starts (None for a tensor without storage: sparse, say)."""
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None


def held_tensors(model: Any) -> list[Any]:
    """Every tensor ``model`` keeps outside its parameters, each once, wherever a cache that
    the next call reads may live: each submodule's own attributes and buffers (searched
    like :func:`tensors_in`), the closures of functions held as attributes, and the
    containers among the globals of the module that defines the model's class. Parameters,
    and tensors that share a parameter's memory (a transposed weight kept for speed), are
    the model itself and are left out."""
    import torch

    internal = set(vars(torch.nn.Module()))  # bookkeeping, parameters, submodules
    weights = {_memory(p) for p in model.parameters()}
    values: list[Any] = _global_values(model)
    for module in model.modules():
        own = [v for k, v in vars(module).items() if k not in internal]
        values += [*own, *module._buffers.values()]
        values += [c for v in own if callable(v) for c in _closure_values(v)]
    found: dict[int, Any] = {}
    for value in values:
        for t in tensors_in(value):
            if not isinstance(t, torch.nn.Parameter) and _memory(t) not in weights:
                found[id(t)] = t
    return list(found.values())
