"""Part 3 worker side of the isolating experiments (the worker's ``adapter_part3_isolate``):
what the student's model computes at each stage of Meta's layer structure, and what a
``generate`` fed the model at every position.

Nothing here judges: the grader compares what these return with its own reference
(``grader/parts/part3/reference.py``). What the worker records is a hint for feedback (the
submission could rewrite it); it never gives or takes points.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A position never fed (in :class:`FedTokens`' rows).
NOT_FED = -1


def stage_modules(model: Any) -> dict[str, Any]:
    """The modules of Meta's layer structure the model has, by stage name: the token
    embeddings, and each layer's attention, feed-forward and the layer itself. A model
    without ``layers`` (a structure of its own) has none but what it names the same."""
    found: dict[str, Any] = {}
    emb = getattr(model, "tok_embeddings", None)
    if emb is not None and callable(emb):
        found["embeddings"] = emb
    layers = getattr(model, "layers", None)
    try:
        layers = list(layers) if layers is not None else []
    except TypeError:
        layers = []
    for i, layer in enumerate(layers):
        for part in ("attention", "feed_forward"):
            module = getattr(layer, part, None)
            if module is not None and hasattr(module, "register_forward_hook"):
                found[f"{part}.{i}"] = module
        if hasattr(layer, "register_forward_hook"):
            found[f"layer.{i}"] = layer
    return found


def _tensor_of(out: Any) -> Any:
    """A module's output tensor: the output itself, or the first element of a tuple (a
    layer that hands its cache back beside its output)."""
    import torch

    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    return out if isinstance(out, torch.Tensor) else None


def run_stages(
    model: Any, tokens: np.ndarray, steps: list[list[int]], device: str
) -> dict[str, np.ndarray]:
    """``model(tokens[:, s : s + n], s)`` for every (s, n) of ``steps``, as
    ``run_forward`` calls it (after :func:`scrub`), with every stage recorded: ``logits``,
    ``out.<stage>`` (each module's output) and ``in.<stage>`` (the input of each attention
    and feed-forward), (B, sum n, width) each, joined on the sequence axis. A stage whose
    module ran other than once per call, or gave (or took) another shape than (B, n,
    width), is left out."""
    import torch

    modules = stage_modules(model)
    seen: dict[str, list[np.ndarray]] = {}
    broken: set[str] = set()

    def keep(key: str, value: Any, n: int) -> None:
        tensor = _tensor_of(value)
        if tensor is None or tensor.ndim != 3 or tuple(tensor.shape[:2]) != (len(tokens), n):
            broken.add(key)
            return
        seen.setdefault(key, []).append(tensor.detach().to("cpu", torch.float32).numpy().copy())

    def hook_for(name: str, n_of: list[int]) -> Any:
        def hook(_module: Any, inputs: Any, out: Any) -> None:
            keep(f"out.{name}", out, n_of[0])
            if not name.startswith(("embeddings", "layer")):
                keep(f"in.{name}", inputs, n_of[0])

        return hook

    ids = torch.as_tensor(tokens, dtype=torch.long, device=device)
    scrub(model, ids)  # before the hooks: its calls are not the plan's
    current = [0]  # the length of the call running now
    handles = [m.register_forward_hook(hook_for(name, current)) for name, m in modules.items()]
    pieces = []
    try:
        with torch.inference_mode():
            for start, n in steps:
                current[0] = n
                out = model(ids[:, start : start + n], start)
                if not isinstance(out, torch.Tensor):
                    raise TypeError(
                        f"forward must return a tensor of logits, got {type(out).__name__}"
                    )
                pieces.append(out.detach().to("cpu", torch.float32).numpy())
    finally:
        for handle in handles:
            handle.remove()
    try:
        arrays = {"logits": np.concatenate(pieces, axis=1)}
    except ValueError:
        shapes = [p.shape for p in pieces]
        raise TypeError(f"successive forward calls returned logits of shapes {shapes}") from None
    for key, got in seen.items():
        if key not in broken and len(got) == len(steps):  # once per call, every call
            arrays[key] = np.concatenate(got, axis=1)
    return arrays


def scrub(model: Any, ids: Any) -> None:
    """Fill whatever cache the model keeps with other tokens' keys and values first (one
    call of the same length at 0), so that a plan never reads right values an earlier plan
    of the same tokens left behind. A model that fails here fails the plan itself."""
    import torch

    other = torch.where(ids > 0, ids - 1, ids + 1)
    try:
        with torch.inference_mode():
            model(other, 0)
    except Exception:  # the plan that follows shows the failure
        pass


class FedTokens:
    """What a generate fed the model, by row and position: the token of each position's
    first feeding (:data:`NOT_FED` where none), and where a later call fed that position
    another token."""

    def __init__(self) -> None:
        self.rows: np.ndarray | None = None
        self.changed: list[list[int]] = []

    def add(self, tokens: Any, start_pos: Any) -> None:
        try:
            ids = np.asarray(tokens.detach().to("cpu").numpy(), dtype=np.int64)
            start = int(start_pos)
        except (AttributeError, TypeError, ValueError):
            return
        if ids.ndim != 2 or start < 0:
            return
        end = start + ids.shape[1]
        if self.rows is None:
            self.rows = np.full((ids.shape[0], end), NOT_FED, dtype=np.int64)
        if self.rows.shape[0] != ids.shape[0]:
            return  # a call of another batch: not one generate's rows
        if self.rows.shape[1] < end:
            grown = np.full((self.rows.shape[0], end), NOT_FED, dtype=np.int64)
            grown[:, : self.rows.shape[1]] = self.rows
            self.rows = grown
        held = self.rows[:, start:end]
        new = held == NOT_FED
        for row, col in zip(*np.nonzero(~new & (held != ids)), strict=True):
            if len(self.changed) < 64:
                self.changed.append([int(row), int(start + col)])
        held[new] = ids[new]

    def arrays(self) -> dict[str, np.ndarray]:
        rows = self.rows if self.rows is not None else np.zeros((0, 0), np.int64)
        return {"fed_tokens": rows}


def encode(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """The prompts' ids as generate encodes them (BOS first, no EOS)."""
    return [[int(t) for t in tokenizer.encode(p, bos=True, eos=False)] for p in prompts]


def decode(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    """The texts of lists of ids (the grader's candidate continuations)."""
    return [str(tokenizer.decode([int(t) for t in row])) for row in rows]
