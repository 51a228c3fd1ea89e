"""Part 3 worker side: finds the tensors that hold a model's KV cache, for the cache probes."""

from __future__ import annotations

from typing import Any


def cache_shapes(model: Any) -> list[list[Any]]:
    """[cache_k shape, cache_v shape] of every module that has them (None when unset)."""
    import torch

    found = []
    for module in model.modules():
        if hasattr(module, "cache_k") or hasattr(module, "cache_v"):
            pair = [getattr(module, "cache_k", None), getattr(module, "cache_v", None)]
            found.append([list(t.shape) if isinstance(t, torch.Tensor) else None for t in pair])
    return found


def cache_dtypes(model: Any) -> dict[str, Any]:
    """The dtypes of every ``cache_k`` / ``cache_v`` tensor the model holds now, and of
    its first floating-point parameter (a hint for feedback: a cache wider than the
    model's keys takes more memory than its shape says)."""
    import torch

    caches = sorted(
        {
            str(t.dtype).removeprefix("torch.")
            for module in model.modules()
            for t in (getattr(module, "cache_k", None), getattr(module, "cache_v", None))
            if isinstance(t, torch.Tensor)
        }
    )
    weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    return {"cache": caches, "model": str(weights).removeprefix("torch.") if weights else None}


#: Names under which a tensor is a cache whatever its shape (Meta's).
CACHE_NAMES = ("cache_k", "cache_v")


def cache_like(
    tensor: Any, named: bool, heads: tuple[int, ...], head_dim: int | None, prefix: int
) -> bool:
    """Whether ``tensor`` may hold keys or values of ``prefix`` positions: anything but a
    parameter or a mask under Meta's names (``named``), else a shape (..., T, heads,
    head_dim) or (..., heads, T, head_dim) with T >= prefix. A layer's kept inputs,
    (B, T, dim), do not look like a cache: scrambling them must not pass for reading one."""
    import torch

    if isinstance(tensor, torch.nn.Parameter) or tensor.dtype == torch.bool:
        return False
    if named or head_dim is None or tensor.ndim < 4 or tensor.shape[-1] != head_dim:
        return named
    rows, cols = tensor.shape[-3], tensor.shape[-2]
    return (cols in heads and rows >= prefix) or (rows in heads and cols >= prefix)


def cache_tensors(
    model: Any, prefix: int, heads: tuple[int, ...] = (), head_dim: int | None = None
) -> list[Any]:
    """The tensors that may be ``model``'s cache (:func:`cache_like`), each once, wherever an
    honest design keeps them: every module's own attributes and buffers (Meta's cache_k /
    cache_v preallocated or allocated on first use, grown with torch.cat or copied at every
    step), and per-layer pairs in the lists, tuples, dicts or objects of any module (a model
    that hands each layer its cache). Without ``head_dim`` only Meta's names count."""
    import torch
    from tensor_search import tensors_in  # the worker's module, flat beside the adapter

    internal = set(vars(torch.nn.Module()))  # bookkeeping, parameters, submodules
    found: dict[int, Any] = {}
    for module in model.modules():
        own = {k: v for k, v in vars(module).items() if k not in internal}
        for key, value in {**own, **module._buffers}.items():
            for t in tensors_in(value):
                if cache_like(t, key in CACHE_NAMES, heads, head_dim, prefix):
                    found[id(t)] = t
    return list(found.values())
