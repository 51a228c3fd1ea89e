"""Whether two versions of a test-case file mean the same thing.

Cases are regenerated on whatever machine a TA has. Another CPU (or another
BLAS kernel) changes the last bits of every float a model computes, and a
value rounded to four decimals can then round the other way; that is not a
change of the solution. So committed and regenerated cases are compared by
meaning: integers, token ids, strings, booleans, keys and shapes exactly,
floats within a tolerance far below what any check tolerates, and a real
change of the solution or of a case builder is still reported.

Tolerances (``|a - b| <= atol + rtol * |b|``):

* floats written in JSON by Parts 2-4 are rounded to four decimals (logit
  fingerprints, the course-format logits) and matched by the checks within
  1e-2: they may differ by two rounding steps, 2e-4, plus 2e-4 relative;
* float32 arrays (base64 in JSON, tensors in checkpoints) carry full precision
  and are matched by the checks within 1e-4 at the tightest: 1e-5;
* Part 1 is plain Python arithmetic, the same on every IEEE machine, and is
  checked to 1e-6 relative: 1e-9 relative.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """How far a regenerated float may be from the committed one."""

    atol: float
    rtol: float

    def close(self, got: float, want: float) -> bool:
        """True when ``got`` is within tolerance of ``want``; never for a NaN against a number."""
        if math.isnan(got) or math.isnan(want):
            return math.isnan(got) and math.isnan(want)
        if math.isinf(got) or math.isinf(want):
            return got == want
        return abs(got - want) <= self.atol + self.rtol * abs(want)


ROUNDED_JSON = Tolerance(atol=2e-4, rtol=2e-4)
ARRAYS = Tolerance(atol=1e-5, rtol=1e-5)
EXACT_ARITHMETIC = Tolerance(atol=0.0, rtol=1e-9)


def json_tolerance(rel: str) -> Tolerance:
    """The float tolerance of the JSON case file at ``rel`` (e.g. ``public/part1.json``)."""
    return EXACT_ARITHMETIC if Path(rel).name.startswith("part1") else ROUNDED_JSON


def _is_array(value: Any) -> bool:
    return isinstance(value, dict) and {"dtype", "shape", "data"} <= set(value)


def _decode(value: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(value["data"])
    return np.frombuffer(raw, dtype=np.dtype(value["dtype"]).newbyteorder("<")).reshape(
        value["shape"]
    )


def compare_arrays(got: np.ndarray, want: np.ndarray, where: str, tol: Tolerance) -> str | None:
    """The first difference between two arrays, or None when they match."""
    if got.shape != want.shape:
        return f"{where}: shape {list(got.shape)} != {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"{where}: dtype {got.dtype} != {want.dtype}"
    if not np.issubdtype(want.dtype, np.floating):
        if not np.array_equal(got, want):
            return f"{where}: values differ"
        return None
    a, b = got.astype(np.float64), want.astype(np.float64)
    same_nan = np.isnan(a) == np.isnan(b)
    close = np.isclose(a, b, atol=tol.atol, rtol=tol.rtol, equal_nan=True)
    bad = np.flatnonzero(~(close & same_nan))
    if bad.size:
        i = int(bad[0])
        return f"{where}: element {i} is {a.flat[i]!r}, was {b.flat[i]!r} ({bad.size} differ)"
    return None


def compare_json(got: Any, want: Any, tol: Tolerance, where: str = "$") -> str | None:
    """The first place where two JSON documents differ in meaning, or None."""
    if _is_array(got) and _is_array(want):
        return compare_arrays(_decode(got), _decode(want), where, ARRAYS)
    if isinstance(want, bool) or isinstance(got, bool):
        return None if got is want else f"{where}: {got!r} != {want!r}"
    if isinstance(want, float) or isinstance(got, float):
        if isinstance(got, int | float) and isinstance(want, int | float):
            return None if tol.close(float(got), float(want)) else f"{where}: {got!r} != {want!r}"
        return f"{where}: {got!r} != {want!r}"
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{where}: {type(got).__name__} where an object was"
        if set(got) != set(want):
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            return f"{where}: keys differ (new {extra}, gone {missing})"
        for key in sorted(want):
            problem = compare_json(got[key], want[key], tol, f"{where}.{key}")
            if problem:
                return problem
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            size = len(got) if isinstance(got, list) else type(got).__name__
            return f"{where}: length {size} != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            problem = compare_json(a, b, tol, f"{where}[{i}]")
            if problem:
                return problem
        return None
    return None if got == want and type(got) is type(want) else f"{where}: {got!r} != {want!r}"


def compare_checkpoints(got: bytes, want: bytes) -> str | None:
    """Two ``torch.save`` files of tensors: same keys, dtypes and shapes, close values."""
    import torch

    a = torch.load(io.BytesIO(got), map_location="cpu", weights_only=True)
    b = torch.load(io.BytesIO(want), map_location="cpu", weights_only=True)
    if set(a) != set(b):
        return f"tensors differ (new {sorted(set(a) - set(b))}, gone {sorted(set(b) - set(a))})"
    for key in sorted(b):
        problem = compare_arrays(a[key].numpy(), b[key].numpy(), key, ARRAYS)
        if problem:
            return problem
    return None


def compare_files(rel: str, got: bytes, want: bytes) -> str | None:
    """Why the regenerated file ``got`` does not mean what the committed ``want`` does."""
    if got == want:
        return None
    suffix = Path(rel).suffix
    try:
        if suffix == ".json":
            return compare_json(json.loads(got), json.loads(want), json_tolerance(rel))
        if suffix in (".pt", ".pth"):
            return compare_checkpoints(got, want)
    except (ValueError, RuntimeError, KeyError, TypeError) as exc:
        return f"cannot be compared: {type(exc).__name__}: {exc}"
    return "bytes differ"
