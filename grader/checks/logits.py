"""Comparing logits from a submission with expected ones, and naming known mistakes.

Pure functions over NumPy arrays: the Part 2 checks call them on what the
worker sent back, after its type and shape have been validated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.cases_part2 import fingerprint, fingerprints_match


@dataclass(frozen=True)
class Comparison:
    """How far a submission's logits are from the expected ones."""

    ok: bool
    max_error: float
    first_bad: int | None  # first sequence position with an error above the tolerance


def logits_problem(value: Any, shape: tuple[int, ...]) -> str:
    """Why ``value`` is not a finite float array of ``shape`` ("" when it is)."""
    if not isinstance(value, np.ndarray):
        return "forward did not return a tensor of logits."
    if value.ndim != 3:
        return f"logits must have 3 dimensions (B, T, vocab), got shape {tuple(value.shape)}."
    if tuple(value.shape) != shape:
        return f"logits have shape {tuple(value.shape)}, expected {shape} (B, T, vocab)."
    if not np.isfinite(value).all():
        bad = np.argwhere(~np.isfinite(value))[0]
        return (
            f"logits contain NaN or inf (first at batch {bad[0]}, position {bad[1]}); "
            "a row of the attention scores may be masked entirely."
        )
    return ""


def compare(got: np.ndarray, expected: np.ndarray, atol: float) -> Comparison:
    """Element-wise absolute error against ``atol``; arrays have equal shapes."""
    err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    per_position = err.max(axis=(0, 2))  # (T,)
    bad = np.flatnonzero(~(per_position <= atol))  # NaN is never within tolerance
    return Comparison(
        ok=bad.size == 0,
        max_error=float(err.max()) if err.size else 0.0,
        first_bad=int(bad[0]) if bad.size else None,
    )


def error_key(signature: str) -> tuple[str, tuple[str, ...]]:
    """An error's type and the names and numbers it quotes: stable across Python
    versions, whose wording of the same error differs (3.10 vs 3.11)."""
    etype, _, message = signature.partition(":")
    quoted = re.findall(r"'([^']*)'|\b(\d+)\b", message)
    return etype.strip(), tuple(sorted(a or b for a, b in quoted))


def same_error_kind(got: Any, want: Any) -> bool:
    """Whether two ``"Type: message"`` signatures describe the same error."""
    if not isinstance(got, str) or not isinstance(want, str) or not got:
        return False
    if got == want:
        return True
    key = error_key(got)
    return bool(key[1]) and key == error_key(want)  # nothing quoted: only exact text counts


def matching_mistakes(
    observed: dict[str, Any], catalogue: dict[str, Any], rerun_differs: bool | None
) -> list[str]:
    """Names of catalogued mistakes whose signature equals what the submission showed.

    ``observed`` is {"logits": array} or {"error": "Type: message"}; ``rerun_differs``
    says whether a second identical run gave different logits (None: not tried).
    """
    names = []
    for name, sig in catalogue.items():
        if not isinstance(sig, dict):
            continue
        nondeterministic = bool(sig.get("nondeterministic") and rerun_differs)
        same_error = "error" in sig and same_error_kind(observed.get("error"), sig["error"])
        same_logits = (
            "logits" in sig
            and "logits" in observed
            and fingerprints_match(fingerprint(observed["logits"]), sig["logits"])
        )
        if nondeterministic or same_error or same_logits:
            names.append(name)
    return names
