"""Plain-data encoding of whatever a submission returns (worker side)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class MissingName(Exception):
    """The submission does not define a name the grader needs."""


def encode_value(value: Any, depth: int = 0) -> dict[str, Any]:
    """Describe a returned value as tagged JSON; unknown objects become their type name."""
    if depth > 4:
        return {"kind": "other", "type": type(value).__name__}
    if isinstance(value, (bool, np.bool_)):
        return {"kind": "bool", "value": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"kind": "int", "value": int(value)}
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return {"kind": "float", "value": v if math.isfinite(v) else repr(v)}
    if isinstance(value, str):
        return {"kind": "str", "value": value[:1000]}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, dict):
        items = list(value.items())[:100]
        return {"kind": "dict", "value": {str(k): encode_value(v, depth + 1) for k, v in items}}
    if isinstance(value, (list, tuple)):
        return {"kind": "list", "value": [encode_value(v, depth + 1) for v in list(value)[:100]]}
    if type(value).__module__ == "torch" and hasattr(value, "numel") and value.numel() == 1:
        return {"kind": "tensor-scalar", "dtype": str(value.dtype), **_scalar(value.item())}
    return {"kind": "other", "type": type(value).__name__}


def _scalar(v: Any) -> dict[str, Any]:
    enc = encode_value(v)
    return {"value": enc.get("value"), "item_kind": enc["kind"]}
