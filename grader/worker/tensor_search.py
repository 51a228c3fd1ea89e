"""Finding the tensors a submission keeps (worker side): its cache, wherever it lives.

An honest cache may be a list of pairs, a dict, a dataclass or a tuple of tuples; the
adapters look inside each of them the same way, to the same depth.
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
