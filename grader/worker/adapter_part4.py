"""Part 4 adapter: drives the student's ``kv_lab.py`` on small GPT-2 models.

The models are built here (``GPT2LMHeadModel`` from a config, seeded random
weights), never downloaded. Every forward call the student's generation makes
is recorded (its input length and its last-position logits), so the parent can
check the call pattern and the logits of every step. Everything returned is
plain data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

module: Any = None
MODELS: dict[str, Any] = {}


def setup() -> None:
    global module
    import importlib

    import torch  # noqa: F401  (imported before the student's code)
    import transformers  # noqa: F401

    module = importlib.import_module("kv_lab")


def build(config: dict[str, int], seed: int) -> Any:
    """A GPT-2 of ``config`` with weights drawn from ``seed`` (the same in every process)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(**config, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def run_generate(mod: Any, model: Any, ids: np.ndarray, n: int, cached: bool) -> dict[str, Any]:
    """The student's greedy generation, with every forward call recorded."""
    import torch

    lengths: list[int] = []
    last: list[np.ndarray] = []
    original = model.forward

    def recording(*args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("input_ids")
        lengths.append(int(given.shape[-1]) if hasattr(given, "shape") else -1)
        out = original(*args, **kwargs)
        logits = getattr(out, "logits", None)
        if isinstance(logits, torch.Tensor) and logits.ndim == 3:
            last.append(logits[:, -1].detach().to(torch.float32).numpy().copy())
        return out

    model.forward = recording
    try:
        fn = mod.generate_with_cache if cached else mod.generate_no_cache
        with torch.no_grad():
            tokens = fn(model, torch.as_tensor(ids, dtype=torch.long), n)
    finally:
        del model.forward
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(
            f"generation must return a torch.Tensor of ids, got {type(tokens).__name__}"
        )
    same = last and all(x.shape == last[0].shape for x in last)
    return {
        "tokens": tokens.detach().to(torch.int64).numpy(),
        "lengths": lengths,
        "step_logits": np.stack(last) if same else np.zeros((0,), np.float32),
    }


def real_cache(model: Any, ids: np.ndarray, dtype: str) -> Any:
    """The cache transformers returns after ``ids``, in ``dtype``."""
    import torch

    m = model.to(getattr(torch, dtype))
    try:
        with torch.no_grad():
            return m(torch.as_tensor(ids, dtype=torch.long), use_cache=True).past_key_values
    finally:
        model.to(torch.float32)


def tensor_bytes(value: Any, depth: int = 0) -> tuple[int, set[str]]:
    """Bytes of every tensor inside ``value`` (dicts, lists, tuples, objects' attributes),
    and their dtypes: how the grader sizes a quantised cache whatever its structure."""
    import torch

    if depth > 6:
        return 0, set()
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size(), {str(value.dtype)}
    items: list[Any] = []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    elif hasattr(value, "__dict__"):
        items = list(vars(value).values())
    total, dtypes = 0, set()
    for item in items:
        b, d = tensor_bytes(item, depth + 1)
        total += b
        dtypes |= d
    return total, dtypes


def cache_tensors(cache: Any) -> list[Any]:
    """[(keys, values)] per layer of a DynamicCache or a legacy tuple."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]


def run_int8(mod: Any, model: Any, ids: np.ndarray, n: int) -> dict[str, Any]:
    """Quantise the student's way; measure memory, reconstruction and greedy agreement."""
    import torch

    prefix = ids[:, :-1]  # the cache holds every token but the last, which is fed next
    fp16 = real_cache(model, prefix, "float16")
    fp16_bytes = sum(k.numel() * 2 + v.numel() * 2 for k, v in cache_tensors(fp16))
    cache = real_cache(model, prefix, "float32")
    originals = [(k.clone(), v.clone()) for k, v in cache_tensors(cache)]
    q = mod.quantize_kv_int8(cache)
    q_bytes, dtypes = tensor_bytes(q)
    deq = mod.dequantize_kv_int8(q)
    errors = []
    for (k0, v0), (k1, v1) in zip(originals, cache_tensors(deq), strict=True):
        for a, b in ((k0, k1), (v0, v1)):
            errors.append(float((a - b.to(a.dtype)).abs().max() / a.abs().max().clamp_min(1e-12)))
    x = torch.as_tensor(ids, dtype=torch.long)
    with torch.no_grad():
        ref = greedy_from(model, x, cache_from(originals), n)
        got = greedy_from(model, x, deq, n)
    return {
        "q_bytes": q_bytes,
        "fp16_bytes": fp16_bytes,
        "dtypes": sorted(dtypes),
        "max_rel_error": max(errors),
        "agree": float((ref == got).float().mean()),
    }


def cache_from(pairs: list[Any]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(pairs):
        cache.update(k, v, i)
    return cache


def greedy_from(model: Any, ids: Any, cache: Any, n: int) -> Any:
    """``n`` greedy tokens continuing ``ids`` whose cache (all but the last token) is given."""
    import torch

    tokens, out = [], ids[:, -1:]
    for _ in range(n):
        result = model(out, past_key_values=cache, use_cache=True)
        cache = result.past_key_values
        out = result.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(out)
    return torch.cat(tokens, dim=1)


# ----------------------------------------------------------------- the protocol


def handle(request: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    op = request.get("op")
    if op == "build":
        MODELS[request["model"]] = build(request["config"], request["seed"])
        return {}, {}
    if op == "call":  # a pure function of plain arguments
        from values import MissingName, encode_value

        fn = getattr(module, request["func"], None)
        if not callable(fn):
            raise MissingName(request["func"])
        args = [
            MODELS[a[1:]] if isinstance(a, str) and a.startswith("@") else a
            for a in request["args"]
        ]
        return {"result": encode_value(fn(*args))}, {}
    if op == "generate":
        out = run_generate(
            module, MODELS[request["model"]], arrays["ids"], request["n"], request["cached"]
        )
        return {"lengths": out["lengths"]}, {
            "tokens": out["tokens"],
            "step_logits": out["step_logits"],
        }
    if op == "measured_bytes":
        cache = real_cache(MODELS[request["model"]], arrays["ids"], request["dtype"])
        from values import encode_value

        return {"result": encode_value(module.measured_kv_bytes(cache))}, {}
    if op == "int8":
        return run_int8(module, MODELS[request["model"]], arrays["ids"], request["n"]), {}
    raise ValueError(f"unknown request {op!r}")
