"""Part 2 worker side: finds the tensors the next cached step may read, for the cache-read
probe (``adapter.cache_read_effect``).

The course's cache is what forward hands back as past_kv, but an honest design may keep
it elsewhere and hand back views or a copy: on a layer (grown, preallocated, copied), in
containers nested to any depth, in a closure, an ``lru_cache`` or a weak dictionary, in
a module-level container of the model's file or of a helper module of the submission's
own (``tensor_search``). The probe must scramble what the next step reads, so it takes
both: the key- and value-shaped tensors of what forward handed back, and those the model
keeps that the prefill wrote; never the weights, and never the layer inputs a design keeps
to project its keys and values again from them (shaped like keys in Part 2, but what the
next step reads instead of a cache: scrambling them must not pass for reading one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def kv_shaped(t: Any, prefix: int, width: int) -> bool:
    """Whether tensor ``t`` is shaped like keys or values of at least ``prefix`` positions
    of ``width`` features: floating point, (..., T, width) or (..., width, T), T >=
    ``prefix``. The course's (B, T_total, D) pairs, views of a preallocated buffer and a
    key held transposed all qualify; masks and position indices do not."""
    if not t.is_floating_point() or t.ndim < 2:
        return False
    rows, cols = t.shape[-2], t.shape[-1]
    return (cols == width and rows >= prefix) or (rows == width and cols >= prefix)


def kv_tensors(value: Any, prefix: int, width: int, model: Any = None) -> list[Any]:
    """Every tensor in ``value`` (what forward handed back as ``past_kv``, searched through
    its lists, tuples, dicts and objects to any depth) that is :func:`kv_shaped`; with
    ``model``, none that shares the memory of one of its parameters (its weights)."""
    from tensor_search import tensors_in, weight_memory  # the worker's, beside the adapter

    weights = weight_memory(model) if model is not None else set()
    return [t for t in tensors_in(value) if kv_shaped(t, prefix, width) and not _in(t, weights)]


def _in(tensor: Any, weights: set[Any]) -> bool:
    """Whether ``tensor`` shares the memory of one of ``weights`` (parameters' memory)."""
    from tensor_search import memory_of

    return bool(weights) and memory_of(tensor) in weights


def held_kv(model: Any, prefix: int, width: int) -> list[Any]:
    """Every :func:`kv_shaped` tensor the model keeps outside its parameters, wherever
    its next call may read it (``tensor_search.held_tensors``)."""
    from tensor_search import held_tensors

    return [t for t in held_tensors(model) if kv_shaped(t, prefix, width)]


@contextlib.contextmanager
def layer_inputs(model: Any) -> Iterator[list[Any]]:
    """The inputs of every ``nn.Linear`` of ``model`` during the block (what W_k and W_v
    project: a layer's normed input), in a list filled as the calls happen."""
    import torch

    seen: list[Any] = []

    def record(_module: Any, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], torch.Tensor):
            seen.append(args[0])

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    hooks = [m.register_forward_pre_hook(record) for m in linears]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def holds_an_input(tensor: Any, inputs: list[Any]) -> bool:
    """Whether ``tensor`` holds one of ``inputs`` (each (B, T, D), recorded by
    :func:`layer_inputs`) in its first T positions, in a run of B consecutive rows: the
    inputs a design keeps to project its keys and values again at every step. Keys and
    values are what W_k and W_v return, never what they were given."""
    import torch

    for x in inputs:
        if x.ndim != 3 or tensor.ndim < 2 or tensor.shape[-1] != x.shape[-1]:
            continue
        if tensor.shape[-2] < x.shape[1] or tensor.dtype != x.dtype:
            continue
        rows = tensor.reshape(-1, *tensor.shape[-2:])[:, : x.shape[1]]
        for j in range(rows.shape[0] - x.shape[0] + 1):
            if torch.equal(rows[j : j + x.shape[0]].to(x.device), x):
                return True
    return False


def snapshot(model: Any, prefix: int, width: int) -> dict[int, tuple[Any, Any]]:
    """:func:`held_kv` by id, each tensor with a copy of what it holds now (kept alive, so
    that no id is reused while the snapshot lives)."""
    return {id(t): (t, t.clone()) for t in held_kv(model, prefix, width)}


def written(model: Any, before: dict[int, tuple[Any, Any]], prefix: int, width: int) -> list[Any]:
    """The :func:`held_kv` tensors that a call made since ``before`` (:func:`snapshot`)
    wrote: new ones, or ones holding other values. A table the call only read (a fixed
    float buffer) is not among them: scrambling it would change every step, cache or no
    cache."""
    import torch

    return [
        t
        for t in held_kv(model, prefix, width)
        if id(t) not in before or not torch.equal(t, before[id(t)][1])  # NaN: written
    ]


def scramble(tensors: list[Any], gen: Any) -> int:
    """Write seeded noise over each of ``tensors`` in place; how many could be written."""
    import torch

    done = 0
    for t in tensors:
        try:  # in inference mode: a forward decorated with it hands back inference tensors
            with torch.inference_mode():
                t.copy_((torch.randn(t.shape, generator=gen) * 3).to(t.device, t.dtype))
            done += 1
        except RuntimeError:  # an expanded view, say: not writable in place
            continue
    return done
