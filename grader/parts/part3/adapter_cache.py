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
    mask under Meta's names (``named``), else a shape (..., T, heads, head_dim) or (...,
    heads, T, head_dim) with T >= prefix. A layer's kept inputs, (B, T, dim), do not look
    like a cache: scrambling them must not pass for reading one. A parameter may be a
    cache (an ``nn.ParameterList`` made at prefill time); the weights are left out by
    their memory (:func:`cache_tensors_by_owner`)."""
    import torch

    if tensor.dtype == torch.bool:
        return False
    if named or head_dim is None or tensor.ndim < 4 or tensor.shape[-1] != head_dim:
        return named
    rows, cols = tensor.shape[-3], tensor.shape[-2]
    return (cols in heads and rows >= prefix) or (rows in heads and cols >= prefix)


def cache_tensors_by_owner(
    model: Any,
    prefix: int,
    heads: tuple[int, ...] = (),
    head_dim: int | None = None,
    protected: set[Any] | None = None,
) -> dict[str, list[Any]]:
    """The tensors that may be ``model``'s cache (:func:`cache_like`), each once, by owner:
    the name of the module that holds them ("" for the model itself), or ``module.name``
    for a global of the submission's own modules. Everything the model can read at its
    next call is searched (``tensor_search.reachable``): every module's own attributes,
    buffers and parameter lists (Meta's cache_k / cache_v preallocated or allocated on
    first use, grown with torch.cat or copied at every step, under any name), per-layer
    pairs in containers of any depth or a deque, closures made at prefill time and kept
    or passed around, and module-level containers of the model's file or of a helper
    module. Tensors sharing the memory in ``protected`` (by default every parameter's:
    the weights) are never among them. Without ``head_dim`` only Meta's names count."""
    from tensor_search import memory_of, reachable, weight_memory  # the worker's, flat

    weights = weight_memory(model) if protected is None else protected
    seen: set[int] = set()
    owners: dict[str, list[Any]] = {}
    for owner, held in reachable(model).items():
        for key, t in held:
            if id(t) in seen or memory_of(t) in weights:
                continue
            if cache_like(t, key in CACHE_NAMES, heads, head_dim, prefix):
                seen.add(id(t))
                owners.setdefault(owner, []).append(t)
    return owners


def cache_tensors(
    model: Any,
    prefix: int,
    heads: tuple[int, ...] = (),
    head_dim: int | None = None,
    protected: set[Any] | None = None,
) -> list[Any]:
    """Every tensor of :func:`cache_tensors_by_owner`, each once."""
    by_owner = cache_tensors_by_owner(model, prefix, heads, head_dim, protected)
    return [t for found in by_owner.values() for t in found]


def written_by(
    model: Any, prefill: Any, prefix: int, heads: tuple[int, ...], head_dim: int | None
) -> dict[str, list[Any]]:
    """The tensors of :func:`cache_tensors_by_owner` that ``prefill()`` (a call of the
    model on other tokens just before) wrote, by owner: new ones, or ones holding other
    values. A table the model only reads (a fixed float buffer shaped like a cache) is
    not among them: scrambling it would change every step, cache or no cache. A parameter
    is among them only where the prefill wrote it (an ``nn.ParameterList`` that holds
    the cache); a weight, or a tensor sharing a weight's memory, never is."""
    import torch
    from tensor_search import memory_of, weight_memory

    weights = weight_memory(model)  # before the prefill: what it makes is not a weight
    before = {id(t): (t, t.clone()) for t in cache_tensors(model, prefix, heads, head_dim, set())}
    prefill()
    changed = {memory_of(t) for t, copy in before.values() if not torch.equal(t, copy)}
    protected = weights - (changed - {None})

    def wrote(t: Any) -> bool:
        if memory_of(t) in protected:
            return False
        return id(t) not in before or not torch.equal(t, before[id(t)][1])  # NaN: written

    owners = cache_tensors_by_owner(model, prefix, heads, head_dim, set())
    kept = {owner: [t for t in found if wrote(t)] for owner, found in owners.items()}
    return {owner: found for owner, found in kept.items() if found}


#: At most this many tensors, of at most this many rows each, go back to the grader
#: (Meta's preallocated cache has max_batch_size rows; a stacked one, layers times that).
MAX_HELD, MAX_ROWS = 64, 256


def seen_positions(tensor: Any, heads: tuple[int, ...], seen: int) -> Any:
    """The first ``seen`` positions of ``tensor`` (a tensor that may hold keys or values,
    :func:`cache_like`) laid out (N, seen, heads, head_dim) in float32 on the CPU: Meta's
    (..., T, H, D) as it is, (..., H, T, D) transposed, every leading axis (rows, a stack
    of layers) flattened into N. None where neither layout fits (a cache_k of some other
    shape), or the tensor is too large to send back."""
    import torch

    if tensor.ndim < 3 or not tensor.is_floating_point():
        return None
    if tensor.shape[-2] in heads and tensor.shape[-3] >= seen:
        held = tensor[..., :seen, :, :]
    elif tensor.shape[-3] in heads and tensor.shape[-2] >= seen:
        held = tensor[..., :seen, :].transpose(-2, -3)
    else:
        return None
    held = held.reshape(-1, *held.shape[-3:])
    if held.shape[0] > MAX_ROWS:
        return None
    return held.detach().to("cpu", torch.float32).numpy().copy()


def chunk_layouts(tensor: Any, heads: tuple[int, ...], seen: int) -> list[Any]:
    """``tensor`` (a tensor that may hold keys or values of fewer than ``seen`` positions:
    one chunk of a cache kept as a list of chunks and joined when read) laid out (N, t,
    heads, head_dim) in float32 on the CPU, in each layout its shape allows: a chunk of as
    many positions as a head count reads both ways. [] where neither fits, the chunk holds
    ``seen`` positions or more (:func:`seen_positions` sends those), or is too large."""
    import torch

    if tensor.ndim < 3 or not tensor.is_floating_point():
        return []
    forms = []
    if tensor.shape[-2] in heads and 0 < tensor.shape[-3] < seen:
        forms.append(tensor)
    if tensor.shape[-3] in heads and 0 < tensor.shape[-2] < seen:
        forms.append(tensor.transpose(-2, -3))
    out = []
    for form in forms:
        form = form.reshape(-1, *form.shape[-3:])
        if form.shape[0] <= MAX_ROWS:
            out.append(form.detach().to("cpu", torch.float32).numpy().copy())
    return out


#: At most this many chunks go back to the grader (a cache kept one tensor per token, for
#: the keys and values of every layer of the probe's model, is well under it).
MAX_CHUNKS = 256


def held_arrays(
    model: Any, seen: int, heads: tuple[int, ...], head_dim: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``model`` holds now that may be its cache of ``seen`` positions: ``t0``, ``t1``
    ... (:func:`seen_positions` of each of :func:`cache_tensors`, parameters included: a
    weight is never shaped like one), ``c0``, ``c1`` ... the tensors of fewer positions
    that may be chunks of a cache kept in pieces (:func:`chunk_layouts`), and the dtypes of
    those tensors and of the model's first floating-point parameter. The grader compares
    them with the reference's keys and values; nothing here knows what they should be."""
    arrays: dict[str, Any] = {}
    chunks: list[Any] = []
    dtypes: set[str] = set()
    for t in cache_tensors(model, 1, heads, head_dim, protected=set()):
        held = seen_positions(t, heads, seen)
        if held is not None and len(arrays) < MAX_HELD:
            arrays[f"t{len(arrays)}"] = held
            dtypes.add(str(t.dtype).removeprefix("torch."))
        elif held is None and len(chunks) < MAX_CHUNKS:
            found = chunk_layouts(t, heads, seen)
            chunks += found[: MAX_CHUNKS - len(chunks)]
            dtypes |= {str(t.dtype).removeprefix("torch.")} if found else set()
    weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    model_dtype = str(weights).removeprefix("torch.") if weights is not None else ""
    arrays |= {f"c{i}": chunk for i, chunk in enumerate(chunks)}
    return arrays, {"cache": sorted(dtypes), "model": model_dtype}
