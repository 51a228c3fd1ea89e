"""Part 2 adapter: drives the student's ``DecoderOnlyTransformer``.

The functions take the student's module (or, in ``python -m grader regen``,
the reference or a mutant) explicitly, so the expected values and the
diagnosis catalogue are produced by exactly the code that later observes
the student. Everything returned is plain data: float32 logits, int64 tokens,
lists of ints.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

if __package__:  # grader.parts.part2.adapter: regen and the tests, in the grader's process
    from grader.parts.part2.adapter_cache import (
        holds_an_input,
        kv_tensors,
        layer_inputs,
        scramble,
        snapshot,
        written,
    )
    from grader.parts.part2.adapter_calls import forward_calls
    from grader.parts.part2.adapter_trace import run_trace
    from grader.parts.part2.adapter_weights import draw_on
else:  # the worker, where the adapter's modules sit beside its main.py
    from adapter_part2_cache import (
        holds_an_input,
        kv_tensors,
        layer_inputs,
        scramble,
        snapshot,
        written,
    )
    from adapter_part2_calls import forward_calls
    from adapter_part2_trace import run_trace
    from adapter_part2_weights import draw_on

module: Any = None
MODELS: dict[str, Any] = {}


def setup() -> None:
    global module
    import torch  # noqa: F401  (imported before the student's code, as the grader expects)
    import transformer_skeleton

    module = transformer_skeleton


def _device() -> str:
    return os.environ.get("KVGRADER_DEVICE", "cpu")


def _device_of(model: Any) -> Any:
    """Where ``model`` lives: the grading device, or the CPU for a model the grader asked
    for there (check 2.9's work probe is measured in CPU time on every device)."""
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return _device()


def _sync() -> None:
    import torch

    if _device() == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _to_numpy(value: Any, what: str) -> np.ndarray:
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    return value.detach().to("cpu", torch.float32).numpy()


def _logits_of(result: Any) -> Any:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(
            "forward must return a pair (logits, new_past_kv), "
            f"got {type(result).__name__}"
            + (f" of length {len(result)}" if hasattr(result, "__len__") else "")
        )
    return result[0], result[1]


def cache_shapes(past_kv: Any) -> list[Any]:
    """Shapes of a returned cache as lists, or a short description of what it is instead."""
    import torch

    if past_kv is None:
        return ["None"]
    if not isinstance(past_kv, (list, tuple)):
        return [f"a {type(past_kv).__name__}"]
    shapes: list[Any] = []
    for layer in past_kv:
        if isinstance(layer, (list, tuple)) and len(layer) == 2:
            shapes.append(
                [list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in layer]
            )
        else:
            shapes.append(type(layer).__name__)
    return shapes


def _tensor(array: np.ndarray) -> Any:
    """A tensor over ``array``'s own memory. The arrays are read-only views of the request's
    bytes, and ``load_state_dict`` copies them into the model, so no copy is made here: a GPU
    workload's weights (1.6 GB) then need their bytes and the model, not a third copy."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        return torch.from_numpy(array)


def build_model(
    mod: Any, config: dict[str, int], weights: dict[str, Any], device: str | None = None
) -> Any:
    """Construct the student's model with ``config`` and load ``weights`` (arrays, or
    tensors already on the device) strictly, on ``device`` (default: the grading device).
    A model whose weights are tensors is constructed on their device: a GPU workload's
    1.6 GB are not made on the CPU first and copied over."""
    import contextlib

    import torch

    if not callable(getattr(mod, "DecoderOnlyTransformer", None)):
        raise LoadError(f"{mod.__name__}.py does not define the class DecoderOnlyTransformer")
    first = next(iter(weights.values()), None)
    where = first.device if isinstance(first, torch.Tensor) else None
    with torch.device(where) if where is not None else contextlib.nullcontext():
        model = mod.DecoderOnlyTransformer(
            config["vocab_size"],
            config["d_model"],
            config["d_ff"],
            config["num_layers"],
            config["max_seq_len"],
        )
    state = {name: _tensor(w) if isinstance(w, np.ndarray) else w for name, w in weights.items()}
    problem = state_dict_problem(model.state_dict(), state)
    if problem:
        raise LoadError(problem)
    model.load_state_dict(state, strict=True)
    return model.to(device or _device()).eval()


class LoadError(Exception):
    """The course weights do not fit the student's model."""


def _some(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" (and {len(names) - most} more)" if len(names) > most else "")


def state_dict_problem(own: dict[str, Any], given: dict[str, Any]) -> str:
    """Why ``given`` weights cannot be loaded strictly into a model whose state is ``own``.

    Keys are named: the ones the model lacks, and the ones it has that the
    course's weight file does not (an attention bias is the usual one).
    """
    problems = []
    lacking = [k for k in given if k not in own]
    extra = [k for k in own if k not in given]
    if lacking:
        problems.append(
            f"your model has no parameter {_some(lacking)}: create every submodule in "
            "__init__ with the handout's attribute names"
        )
    if extra:
        problem = (
            f"your model has {len(extra)} parameter(s) that the course's model_state_dict.pt "
            f"does not have: {_some(extra)}"
        )
        if any(".attention." in k and k.endswith(".bias") for k in extra):
            problem += (
                " (the course's attention projections W_q, W_k, W_v and W_o have no bias: "
                "nn.Linear(d_model, d_model, bias=False))"
            )
        problems.append(problem)
    shapes = [
        f"{k} is {tuple(own[k].shape)} in your model but {tuple(given[k].shape)} in the weights"
        for k in given
        if k in own and tuple(own[k].shape) != tuple(given[k].shape)
    ]
    if shapes:
        problems.append("; ".join(shapes[:3]))
    return "; ".join(problems)


def run_forward(model: Any, input_ids: np.ndarray, steps: list[int] | None) -> dict[str, Any]:
    """Logits for ``input_ids`` (B, T): one call without the cache when ``steps`` is None,
    else successive cached calls on chunks of the given lengths. Returns the logits of
    every position (B, T, vocab) and the cache shapes after every call."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long, device=_device_of(model))
    shapes: list[Any] = []
    with torch.no_grad():
        if steps is None:
            logits, _ = _logits_of(model(ids, use_cache=False))
            out = _to_numpy(logits, "logits")
        else:
            past, pieces, start = None, [], 0
            for n in steps:
                logits, past = _logits_of(
                    model(ids[:, start : start + n], past_kv=past, use_cache=True)
                )
                pieces.append(_to_numpy(logits, "logits"))
                shapes.append(cache_shapes(past))
                start += n
            out = np.concatenate(pieces, axis=1) if all(p.ndim == 3 for p in pieces) else pieces[0]
    _sync()
    return {"logits": out, "cache_shapes": shapes}


def run_cache_values(model: Any, input_ids: np.ndarray, steps: list[int]) -> dict[str, Any]:
    """What the cache holds after successive cached calls on chunks of ``steps``: each
    layer's two tensors as float32 arrays (``k0``, ``v0``, ``k1``, ...), and a description
    of whatever the model returned instead of (K, V) pairs of tensors."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long, device=_device_of(model))
    past, start = None, 0
    with torch.no_grad():
        for n in steps:
            _, past = _logits_of(model(ids[:, start : start + n], past_kv=past, use_cache=True))
            start += n
    _sync()
    arrays: dict[str, np.ndarray] = {}
    held: set[str] = set()
    for i, layer in enumerate(past if isinstance(past, (list, tuple)) else []):
        if isinstance(layer, (list, tuple)) and len(layer) == 2:
            for name, t in zip("kv", layer, strict=True):
                if isinstance(t, torch.Tensor):
                    arrays[f"{name}{i}"] = t.detach().to("cpu", torch.float32).numpy()
                    held.add(str(t.dtype).removeprefix("torch."))
    weights = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
    dtypes = {"cache": sorted(held), "model": sorted(weights)}
    return {"arrays": arrays, "shapes": cache_shapes(past), "dtypes": dtypes}


def cache_read_effect(model: Any, input_ids: np.ndarray, prefix: int, width: int) -> float | None:
    """The largest change of the last step's logits when the cache the next step may read
    after a prefill of ``prefix`` tokens is overwritten with noise, in place, before the
    single-token steps on the rest of ``input_ids``, each fed the cache the previous call
    returned. That cache is every :func:`kv_tensors` of what forward handed back, and every
    key- or value-shaped tensor the model keeps that the prefill wrote (:func:`written`: a
    cache kept on the layers, in a closure or in a helper module's globals, and handed
    back as a copy), never a weight, nor a tensor that holds what one of the model's
    linear layers was given (:func:`holds_an_input`: inputs kept to project the keys and
    values again, which the next step reads instead of a cache). A cache read at every
    step keeps the prompt's scrambled keys and values to the end, so the last step
    changes; a forward that recomputes the prefix at any step (at once, or every few
    calls) has healed by then. The unscrambled steps follow the same prefill again.
    Infinite where only the scrambled run is NaN; None where no such tensor exists or none
    can be written (a design with no readable cache: the other probes judge it)."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long, device=_device_of(model))
    gen = torch.Generator(device="cpu").manual_seed(0)

    def steps(past: Any) -> np.ndarray:
        logits = None
        for t in range(prefix, ids.shape[1]):
            logits, past = _logits_of(model(ids[:, t : t + 1], past_kv=past, use_cache=True))
        return _to_numpy(logits, "logits")

    with torch.no_grad():
        before = snapshot(model, prefix, width)
        with layer_inputs(model) as inputs:
            _, past = _logits_of(model(ids[:, :prefix], use_cache=True))
        held = [t for t in written(model, before, prefix, width) if not holds_an_input(t, inputs)]
        found = [*kv_tensors(past, prefix, width, model), *held]
        del before, inputs
        if not scramble(list({id(t): t for t in found}.values()), gen):
            return None
        scrambled = steps(past)
        _, past = _logits_of(model(ids[:, :prefix], use_cache=True))
        plain = steps(past)
    _sync()
    change = np.abs(plain.astype(np.float64) - scrambled)
    change[np.isnan(scrambled) & ~np.isnan(plain)] = np.inf
    return float(change.max())


def run_generate(
    model: Any,
    input_ids: np.ndarray,
    max_new_tokens: int,
    temperature: float | None,
    use_cache: bool | None,
    seed: int,
) -> dict[str, Any]:
    """Seeded ``generate``, recording how many tokens every ``forward`` call received,
    whichever way generate reaches forward (:func:`forward_calls`; a hint for feedback:
    the submission can rewrite this record). A ``temperature`` or ``use_cache`` of None
    is left out of the call, so generate's own default applies."""
    import torch

    ids = torch.as_tensor(input_ids, dtype=torch.long, device=_device_of(model))
    with forward_calls(model) as lengths:
        torch.manual_seed(seed)
        # Called as the student's own script calls it, outside no_grad: the timed runs
        # measure what their generate costs (the skeleton's decorator turns autograd off).
        given = {"temperature": temperature, "use_cache": use_cache}
        options = {k: v for k, v in given.items() if v is not None}
        tokens = model.generate(ids, max_new_tokens, **options)
        _sync()
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"generate must return a torch.Tensor, got {type(tokens).__name__}")
    if tokens.is_floating_point():
        raise TypeError(f"generate must return token ids (an integer tensor), got {tokens.dtype}")
    return {"tokens": tokens.detach().to("cpu", torch.int64).numpy(), "forward_lengths": lengths}


def run_sample(model: Any, logits: np.ndarray, temperature: float, seed: int) -> np.ndarray:
    """The submission's ``sample`` alone on ``logits`` (B, vocab) the grader chose, seeded:
    the token ids it drew, as int64 (whatever shape it returned them in)."""
    import torch

    torch.manual_seed(seed)
    z = torch.as_tensor(logits, dtype=torch.float32, device=_device_of(model))
    with torch.no_grad():
        tokens = model.sample(z, temperature)
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point():
        raise TypeError("sample must return token ids (an integer tensor)")
    return tokens.detach().to("cpu", torch.int64).numpy()


# ----------------------------------------------------------------- the protocol


def _model(request: dict[str, Any]) -> Any:
    name = request.get("model")
    if name not in MODELS:
        raise RuntimeError(f"model {name!r} is not loaded")
    return MODELS[name]


def _maybe(kind: Any, value: Any) -> Any:
    """``kind(value)``, or None for None (an argument left to generate's default)."""
    return None if value is None else kind(value)


def handle(request: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    op = request.get("op")
    if op == "load":
        device = "cpu" if request.get("device") == "cpu" else None
        weights: dict[str, Any] = arrays
        if request.get("on_device"):  # a GPU workload's model: drawn here, not sent
            weights = draw_on(request["config"], int(request["seed"]), device or _device())
        MODELS[request["model"]] = build_model(module, request["config"], weights, device)
        return {}, {}
    if op == "forward":
        result = run_forward(_model(request), arrays["input_ids"], request.get("steps"))
        return {"cache_shapes": result["cache_shapes"]}, {"logits": result["logits"]}
    if op == "cache_values":
        result = run_cache_values(_model(request), arrays["input_ids"], request["steps"])
        return {"cache_shapes": result["shapes"], "dtypes": result["dtypes"]}, result["arrays"]
    if op == "trace":  # every piece's input and output, for a failed check's isolation
        layers = int(request["layers"])
        return {}, run_trace(_model(request), arrays["input_ids"], request.get("steps"), layers)
    if op == "sample":  # the sampler alone, on logits the grader chose
        tokens = run_sample(
            _model(request), arrays["logits"], float(request["temperature"]), int(request["seed"])
        )
        return {}, {"tokens": tokens}
    if op == "cache_read":  # the last step's change with the prefill's cache scrambled
        effect = cache_read_effect(
            _model(request), arrays["input_ids"], int(request["prefix"]), int(request["width"])
        )
        return {"effect": effect}, {}
    if op == "generate":
        result = run_generate(
            _model(request),
            arrays["input_ids"],
            int(request["max_new_tokens"]),
            _maybe(float, request.get("temperature")),
            _maybe(bool, request.get("use_cache")),
            int(request["seed"]),
        )
        return {"forward_lengths": result["forward_lengths"]}, {"tokens": result["tokens"]}
    raise ValueError(f"unknown request {op!r}")
