"""Part 4 adapter: where the models run (the worker's module ``adapter_part4_device``).

The grading device comes from the worker's environment (``KVGRADER_DEVICE``: ``cpu`` or
``cuda``); inputs follow the model, and a GPU's queued work is waited for before a
reply, so that the parent's clock covers it."""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def device() -> str:
    """The grading device, from the worker's environment."""
    return os.environ.get("KVGRADER_DEVICE", "cpu")


def sync() -> None:
    """Wait for queued GPU work (nothing on the CPU)."""
    import torch

    if device() == "cuda":
        torch.cuda.synchronize()


def model_device(model: Any) -> Any:
    return next(model.parameters()).device


def as_ids(model: Any, ids: np.ndarray) -> Any:
    """Token ids as a long tensor on the model's device."""
    import torch

    return torch.as_tensor(np.asarray(ids), dtype=torch.long).to(model_device(model))
