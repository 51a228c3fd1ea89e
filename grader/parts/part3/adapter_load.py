"""Part 3 worker side: builds the student's Llama on the grading device and notes how."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: How the student's code was built and what the worker did for it (reported to the
#: grader with every build, for feedback): ``cuda_calls`` counts ``.cuda()`` calls sent
#: to the grading device because this machine has no GPU.
NOTES: dict[str, Any] = {"cuda_calls": 0}


def _device() -> str:
    return os.environ.get("KVGRADER_DEVICE", "cpu")


class LoadError(Exception):
    """The checkpoint does not fit the student's model."""


def model_class(mod: Any) -> Any:
    """The student's model class: ``Llama`` (the kit's and the course's name) or Meta's
    ``Transformer``, whichever is an ``nn.Module``."""
    import torch

    for name in ("Llama", "Transformer"):
        cls = getattr(mod, name, None)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            return cls
    raise LoadError(
        "llama/model.py has no model class: define Llama (or Transformer), an nn.Module "
        "built as Llama(ModelArgs(...))"
    )


def model_args(mod: Any, values: dict[str, Any]) -> Any:
    """``ModelArgs`` of the fields the student's class has: a checkpoint's params.json may
    name more (``use_scaled_rope``), which the course's ``ModelArgs`` lacks. What was left
    out is noted for feedback."""
    import dataclasses
    import inspect

    cls = mod.ModelArgs
    if dataclasses.is_dataclass(cls):
        known = {f.name for f in dataclasses.fields(cls)}
    else:
        known = set(inspect.signature(cls).parameters)
    dropped = sorted(set(values) - known)
    if dropped:
        NOTES["dropped_fields"] = dropped
    return cls(**{k: v for k, v in values.items() if k in known})


def build_from_checkpoint(pkg: dict[str, Any], settings: dict[str, Any]) -> tuple[Any, Any]:
    """``Llama.build`` on a checkpoint folder in Meta's layout; where the student's class
    has none (the course's code builds its model in its scripts), the course's way:
    ``Llama(ModelArgs(**params.json))``, then a strict ``load_state_dict``."""
    device = settings.get("device") or _device()
    llama = model_class(pkg["model"])
    if not callable(getattr(llama, "build", None)):
        return build_course_style(pkg, llama, settings, device)
    NOTES["built_by"] = "build"
    model, tokenizer = llama.build(
        settings["ckpt_dir"],
        settings["tokenizer_path"],
        max_seq_len=settings["max_seq_len"],
        max_batch_size=settings["max_batch_size"],
        device=device,
        kv_caching=settings["kv_caching"],
    )
    return model.eval(), tokenizer


def build_course_style(
    pkg: dict[str, Any], llama: Any, settings: dict[str, Any], device: str
) -> tuple[Any, Any]:
    """The course's build: params.json's fields the student's ``ModelArgs`` knows, the
    vocabulary of the checkpoint's embedding, the student's own ``Tokenizer``."""
    import json
    from pathlib import Path

    import torch

    NOTES["built_by"] = "constructor"
    if "tokenizer" not in pkg:
        raise LoadError("your Llama has no build() and llama/tokenizer.py has no Tokenizer")
    ckpt = Path(settings["ckpt_dir"])
    params = json.loads((ckpt / "params.json").read_text())
    state = torch.load(ckpt / "consolidated.00.pth", map_location="cpu", weights_only=True)
    state.pop("rope.freqs", None)  # Meta ships it; the model computes its own
    args = model_args(
        pkg["model"],
        {
            **params,
            "vocab_size": int(state["tok_embeddings.weight"].shape[0]),
            "max_seq_len": settings["max_seq_len"],
            "max_batch_size": settings["max_batch_size"],
            "kv_caching": settings["kv_caching"],
        },
    )
    model = llama(args)
    strict_load(model, state)
    tokenizer = pkg["tokenizer"].Tokenizer(settings["tokenizer_path"])
    return model.to(device).eval(), tokenizer


def build_from_arrays(
    pkg: dict[str, Any], settings: dict[str, Any], weights: dict[str, Any]
) -> Any:
    """``Llama(ModelArgs(...))`` with weights sent by the grader (arrays), or drawn on the
    device (tensors: the model is then made there, not on the CPU first), loaded strictly."""
    import contextlib

    import torch

    mod = pkg["model"]
    args = model_args(
        mod,
        {
            **settings["params"],
            "vocab_size": settings["vocab_size"],
            "max_seq_len": settings["max_seq_len"],
            "max_batch_size": settings["max_batch_size"],
            "kv_caching": settings["kv_caching"],
        },
    )
    first = next(iter(weights.values()), None)
    where = first.device if isinstance(first, torch.Tensor) else None
    with torch.device(where) if where is not None else contextlib.nullcontext():
        model = model_class(mod)(args)
    state = {
        k: v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v))
        for k, v in weights.items()
    }
    strict_load(model, state)
    return model.to(_device()).eval()


def strict_load(model: Any, state: dict[str, Any]) -> None:
    """``load_state_dict(strict=True)``, with an error that names the parameters on each
    side that the other lacks (and LoRA layers left on, the course's Phase 3)."""
    own = model.state_dict()
    lacking, extra = sorted(set(state) - set(own)), sorted(set(own) - set(state))
    if lacking or extra:
        lines = ["The checkpoint does not fit your Llama."]
        if extra:
            lines.append(f"Your model has parameters the checkpoint lacks: {', '.join(extra[:4])}")
        if lacking:
            lines.append(f"The checkpoint has weights your model lacks: {', '.join(lacking[:4])}")
        if any("lora" in name.lower() for name in extra):
            lines.append(
                "Your model has LoRA parameters: Phase 3's LoRA layers are switched on. This "
                "part grades the Phase 2 model: build it without them (Meta's parameter names)"
            )
        raise LoadError("\n".join(lines))
    model.load_state_dict(state, strict=True)


def build_notes(model: Any) -> dict[str, Any]:
    """What the grader tells the student about how their model was built."""
    return {**NOTES, "switch": callable(getattr(model, "set_kv_caching", None))}
