"""What each piece of the submission's model computed (the worker's module
``adapter_part2_trace``), for the isolating experiments of a failed check.

Forward hooks on the course's layer structure, which the course weights fix (they load
strictly into ``layers.<i>`` with its ``attention`` and ``feed_forward``), record the
input and output of every decoder layer, attention and feed-forward block in each call of
a forward plan, with the logits and the cache each call handed back. The grader then
recomputes every piece on the very input it was given (:mod:`reference_np`) and finds the
first that departs. A piece the submission never called (attention written inline in the
layer) is simply not recorded. Only the first call of a piece in one forward call counts.
Imports nothing of the grader.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

#: The pieces recorded, by their attribute under ``layers.<i>`` ("" is the layer itself).
PIECES = {"layer": "", "attention": "attention", "feed_forward": "feed_forward"}


def _first_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    if isinstance(value, dict):
        return next((v for v in value.values() if isinstance(v, torch.Tensor)), None)
    return None


def _array(t: Any) -> np.ndarray:
    import torch

    return t.detach().to("cpu", torch.float32).numpy().copy()


@contextmanager
def recorded(model: Any, layers: int, seen: dict[str, np.ndarray], tag: list[str]):
    """Hooks that write ``seen["<tag>.l<i>.<piece>.in"]`` and ``...out"`` for the first
    call of each piece while the block runs (``tag[0]``: the current forward call)."""
    handles = []

    def hook_for(name: str):
        def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            key = f"{tag[0]}.{name}"
            x, y = _first_tensor(args) if args else _first_tensor(kwargs), _first_tensor(output)
            if x is None or y is None or f"{key}.in" in seen:
                return
            seen[f"{key}.in"], seen[f"{key}.out"] = _array(x), _array(y)

        return hook

    try:
        for i in range(layers):
            for piece, attr in PIECES.items():
                try:
                    module = model.get_submodule(f"layers.{i}" + (f".{attr}" if attr else ""))
                except (AttributeError, TypeError):
                    continue
                hook = hook_for(f"l{i}.{piece}")
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_trace(model: Any, input_ids: np.ndarray, steps: list[int] | None, layers: int) -> dict:
    """The pieces' inputs and outputs in every call of the plan ``steps`` (None: one call
    without the cache), each call's logits (``c<k>.logits``) and the cache it handed back
    (``c<k>.k<i>``, ``c<k>.v<i>``: each layer's pair, where it is one of tensors)."""
    import torch

    from_model = next(model.parameters()).device
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=from_model)
    seen: dict[str, np.ndarray] = {}
    tag = ["c0"]
    past, start = None, 0
    plan = steps or [ids.shape[1]]
    with torch.no_grad(), recorded(model, layers, seen, tag):
        for c, n in enumerate(plan):
            tag[0] = f"c{c}"
            chunk = ids[:, start : start + n]
            if steps is None:
                result = model(chunk, use_cache=False)
            else:
                result = model(chunk, past_kv=past, use_cache=True)
            logits, past = result[0], result[1]
            if isinstance(logits, torch.Tensor):
                seen[f"c{c}.logits"] = _array(logits)
            for i, pair in enumerate(past if isinstance(past, (list, tuple)) else []):
                if isinstance(pair, (list, tuple)) and len(pair) == 2:
                    for name, t in zip("kv", pair, strict=True):
                        if isinstance(t, torch.Tensor):
                            seen[f"c{c}.{name}{i}"] = _array(t)
            start += n
    return seen
