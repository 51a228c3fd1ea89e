"""Arrays in the test-case files and the diagnosis catalogue: float32 arrays as JSON,
the digest that pins seeded weights, and the short fingerprint by which a mutant's
logits are recognised. Shared by every part's cases and checks."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import numpy as np

FINGERPRINT_VOCAB = 8  # logits kept per position in a mutant's fingerprint
FINGERPRINT_ATOL = 1e-2  # fingerprints agree within this (Part 2's logit tolerance)


def encode_array(array: np.ndarray) -> dict[str, Any]:
    """A float32 array as JSON: dtype, shape and little-endian bytes in base64."""
    a = np.ascontiguousarray(array, dtype="<f4")
    return {
        "dtype": "float32",
        "shape": list(a.shape),
        "data": base64.b64encode(a.tobytes()).decode(),
    }


def decode_array(value: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(value["data"])
    return np.frombuffer(raw, dtype="<f4").reshape(value["shape"]).astype(np.float32)


def weights_digest(weights: dict[str, np.ndarray]) -> str:
    """sha256 over names and bytes: detects a NumPy whose generator stream changed."""
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name], dtype="<f4").tobytes())
    return h.hexdigest()


def fingerprint(logits: np.ndarray) -> list[list[float | None]]:
    """The first row's first logits at every position; non-finite values as None."""
    head = logits[0, :, :FINGERPRINT_VOCAB].astype(float)
    return [[round(float(x), 4) if np.isfinite(x) else None for x in row] for row in head]


def fingerprints_match(got: list[list[float | None]], want: list[list[float | None]]) -> bool:
    """Same shape, same non-finite places, finite values within :data:`FINGERPRINT_ATOL`."""
    if len(got) != len(want) or any(len(a) != len(b) for a, b in zip(got, want, strict=True)):
        return False
    for row_a, row_b in zip(got, want, strict=True):
        for a, b in zip(row_a, row_b, strict=True):
            if (a is None) != (b is None) or (a is not None and abs(a - b) > FINGERPRINT_ATOL):
                return False
    return True
