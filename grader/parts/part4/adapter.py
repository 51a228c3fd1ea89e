"""Part 4 adapter: drives the student's ``kv_lab.py`` on small GPT-2 models.

The models are built here (``GPT2LMHeadModel`` from a config, seeded random
weights), never downloaded, on the grading device (``KVGRADER_DEVICE``: the
worker's environment says ``cpu`` or ``cuda``); inputs follow the model and
outputs come back to the CPU. Every forward call the student's generation
makes is recorded (its input length and its last-position logits), so the
parent can check the call pattern and the logits of every step.

Everything returned is raw data (tokens, logits, the tensors the student's
int8 functions produced, the figures ``measure_latency`` returned): the parent
judges it. Nothing here decides a score, since the submission shares this
process and can change anything in it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

if __package__:  # grader.parts.part4.adapter: regen and the tests, in the grader's process
    from grader.parts.part4.adapter_device import as_ids, device, model_device, sync
    from grader.parts.part4.adapter_latency import run_latency, run_latency_timed
else:  # adapter_part4.py, flat among the worker's scripts in the sandbox
    from adapter_part4_device import as_ids, device, model_device, sync
    from adapter_part4_latency import run_latency, run_latency_timed

__all__ = ["as_ids", "device", "model_device", "sync"]

module: Any = None
MODELS: dict[str, Any] = {}
MAX_INT8_TENSORS = 256  # tensors of a quantised cache sent back, at most


def setup() -> None:
    global module
    import importlib

    import torch  # noqa: F401  (imported before the student's code)
    import transformers  # noqa: F401

    module = importlib.import_module("kv_lab")


def build(config: dict[str, int], seed: int, on: str | None = None, on_device: bool = False) -> Any:
    """A GPT-2 of ``config`` with weights drawn from ``seed`` (the same in every process),
    in eval mode on ``on`` (default: the grading device). The weights are drawn on the
    CPU, so they are the same whichever device the model then runs on; ``on_device``
    draws them where the model runs instead (the same in every process on that device)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)  # every device's generator
    cfg = GPT2Config(**config, bos_token_id=0, eos_token_id=0)
    target = on or device()
    if on_device:
        with torch.device(target):
            return GPT2LMHeadModel(cfg).eval()
    return GPT2LMHeadModel(cfg).eval().to(target)


def run_generate(
    mod: Any,
    model: Any,
    ids: np.ndarray,
    n: int,
    cached: bool,
    cached_prefix: int = 0,
    gaps: bool = False,
) -> dict[str, Any]:
    """The student's greedy generation, with every forward call recorded.

    The generation runs as a script of the student's would run it: in the grad mode
    Python starts with, under no context of the grader's, so that what it costs is its
    own (a lab that leaves out ``torch.no_grad()`` builds autograd's graph, and
    ``grad_recorded`` says so). ``cached_prefix`` > 0 calls
    ``generate_with_cache_from`` with a cache of the first ``cached_prefix`` tokens
    (built here, under ``no_grad``, before the recording starts). With ``gaps``,
    each step keeps its best-minus-runner-up logit per row, taken on the model's device,
    instead of the whole last-position logits: a batch of long runs over GPT-2's
    vocabulary would otherwise fill the host's memory."""
    import torch

    x = as_ids(model, ids)
    past = None
    if cached_prefix:
        with torch.no_grad():
            past = model(x[:, :cached_prefix], use_cache=True).past_key_values
    lengths: list[int] = []
    use_cache: list[bool] = []  # what each call asked for (the call pattern, as a hint)
    past_given: list[bool] = []  # whether each call was given a cache
    last: list[np.ndarray] = []
    grad_recorded = [False]  # whether a call's logits carry autograd's history
    original = model.forward

    def recording(*args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("input_ids")
        lengths.append(int(given.shape[-1]) if hasattr(given, "shape") else -1)
        use_cache.append(bool(kwargs.get("use_cache")))
        past_given.append(kwargs.get("past_key_values") is not None)
        out = original(*args, **kwargs)
        logits = getattr(out, "logits", None)
        if isinstance(logits, torch.Tensor) and logits.ndim == 3:
            grad_recorded[0] |= bool(logits.requires_grad)
            step = logits[:, -1].detach().float()  # (B, vocab)
            if gaps:
                top = step.topk(2, dim=-1).values  # (B, 2)
                step = top[:, 0] - top[:, 1]  # (B,)
            last.append(step.to("cpu").numpy().copy())
        return out

    model.forward = recording
    try:
        if cached_prefix:
            tokens = mod.generate_with_cache_from(model, x, past, n)
        elif cached:
            tokens = mod.generate_with_cache(model, x, n)
        else:
            tokens = mod.generate_no_cache(model, x, n)
        sync()
    finally:
        del model.forward
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(
            f"generation must return a torch.Tensor of ids, got {type(tokens).__name__}"
        )
    same = last and all(x.shape == last[0].shape for x in last)
    return {
        "tokens": tokens.detach().to("cpu", torch.int64).numpy(),
        "lengths": lengths,
        "use_cache": use_cache,
        "past_given": past_given,
        "grad_recorded": grad_recorded[0],
        "step_logits": np.stack(last) if same else np.zeros((0,), np.float32),
    }


def real_cache(model: Any, ids: np.ndarray, dtype: str) -> Any:
    """The cache transformers returns after ``ids``, in ``dtype``."""
    import torch

    m = model.to(getattr(torch, dtype))
    try:
        with torch.no_grad():
            return m(as_ids(model, ids), use_cache=True).past_key_values
    finally:
        model.to(torch.float32)


def cache_tensors(cache: Any) -> list[Any]:
    """[(keys, values)] per layer of a DynamicCache or a legacy tuple."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]


def tensors_in(value: Any, path: str = "q", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(path, tensor) for every tensor inside ``value`` (dicts, lists, tuples, objects'
    attributes): what a quantised cache holds, whatever its structure."""
    import torch

    if depth > 6:
        return
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif hasattr(value, "__dict__"):
        items = [(str(k), v) for k, v in vars(value).items()]
    else:
        return
    for key, item in items:
        yield from tensors_in(item, f"{path}.{key}", depth + 1)


def plain(t: Any) -> np.ndarray:
    """A tensor as a numpy array of its own dtype (bfloat16 and others as float32)."""
    import torch

    t = t.detach().to("cpu")
    if t.dtype in (torch.int8, torch.uint8, torch.float16, torch.float32, torch.int64):
        return t.contiguous().numpy()
    return t.to(torch.float32).numpy()


def round_trip(mod: Any, cache: Any) -> tuple[dict, dict]:
    """Quantise ``cache`` the student's way and dequantise it. Returns every tensor the
    quantised cache holds (and their dtypes), what ``quantized_kv_bytes`` said, and the
    dequantised keys and values with their dtypes; the dequantised cache is kept in
    ``arrays["_deq"]`` for the caller to generate from (popped before sending)."""
    from values import encode_value

    q = mod.quantize_kv_int8(cache)
    found = list(tensors_in(q))[:MAX_INT8_TENSORS]
    arrays: dict[str, Any] = {f"q{i}": plain(t) for i, (_, t) in enumerate(found)}
    header: dict[str, Any] = {
        "q_paths": [p for p, _ in found],
        "q_dtypes": [str(t.dtype).removeprefix("torch.") for _, t in found],
        "reported_bytes": encode_value(mod.quantized_kv_bytes(q)),
    }
    deq = mod.dequantize_kv_int8(q)
    pairs = cache_tensors(deq)
    for i, (k, v) in enumerate(pairs):
        arrays[f"deq_k{i}"], arrays[f"deq_v{i}"] = plain(k), plain(v)
    header["deq_layers"] = len(pairs)
    header["deq_dtypes"] = [str(t.dtype).removeprefix("torch.") for kv in pairs for t in kv]
    arrays["_deq"] = deq
    return header, arrays


def run_int8(mod: Any, model: Any, ids: np.ndarray, n: int) -> tuple[dict, dict]:
    """Quantise the fp32 cache of all but the last token the student's way, dequantise
    it, and continue greedy generation from the dequantised cache for ``n`` tokens.
    Returns what :func:`round_trip` does and the tokens: the parent measures the rest."""
    import torch

    cache = real_cache(model, ids[:, :-1], "float32")
    header, arrays = round_trip(mod, cache)
    deq = arrays.pop("_deq")
    x = as_ids(model, ids)
    with torch.no_grad():
        arrays["tokens"] = greedy_from(model, x, deq, n).to("cpu").numpy()
    return header, arrays


def run_int8_cache(mod: Any, arrays: dict[str, np.ndarray], layers: int) -> tuple[dict, dict]:
    """:func:`round_trip` of a cache the grader made up: ``k0``, ``v0``, ``k1``, ... in
    their own dtype, put into a fresh DynamicCache on the grading device."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    for i in range(layers):
        k, v = (torch.as_tensor(np.array(arrays[f"{kv}{i}"])).to(device()) for kv in "kv")
        cache.update(k, v, i)
    header, out = round_trip(mod, cache)
    out.pop("_deq")
    return header, out


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
        on_device = bool(request.get("on_device"))
        MODELS[request["model"]] = build(request["config"], request["seed"], on_device=on_device)
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
            module,
            MODELS[request["model"]],
            arrays["ids"],
            request["n"],
            request["cached"],
            int(request.get("cached_prefix", 0)),
            gaps=bool(request.get("gaps_only")),
        )
        header = {k: out[k] for k in ("lengths", "use_cache", "past_given", "grad_recorded")}
        if request.get("tokens_only"):  # a timed run: only its tokens are compared
            return header, {"tokens": out["tokens"]}
        if request.get("gaps_only"):  # a long run's logits outgrow a reply: (steps, B) gaps
            return header, {"tokens": out["tokens"], "step_gaps": out["step_logits"]}
        return header, {
            "tokens": out["tokens"],
            "step_logits": out["step_logits"],
        }
    if op == "measured_bytes":
        cache = real_cache(MODELS[request["model"]], arrays["ids"], request["dtype"])
        from values import encode_value

        return {"result": encode_value(module.measured_kv_bytes(cache))}, {}
    if op == "int8":
        return run_int8(module, MODELS[request["model"]], arrays["ids"], request["n"])
    if op == "latency":
        return run_latency(module, MODELS[request["model"]], request), {}
    if op == "latency_timed":
        return run_latency_timed(module, MODELS[request["model"]], request), {}
    if op == "int8_cache":
        return run_int8_cache(module, arrays, int(request["layers"]))
    raise ValueError(f"unknown request {op!r}")
