"""Comparing logits from a submission with expected ones, and naming known mistakes.

Pure functions over NumPy arrays: the Part 2 checks call them on what the
worker sent back, after its type and shape have been validated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.core.arrays import fingerprint, fingerprints_match
from grader.core.feedback_items import Cause


@dataclass(frozen=True)
class Comparison:
    """How far a submission's logits are from the expected ones."""

    ok: bool
    max_error: float
    first_bad: int | None  # first sequence position with an error above the tolerance
    per_position: tuple[float, ...] = ()  # the largest error at each sequence position


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
            f"logits contain NaN or inf (first in batch row {bad[0] + 1} of {value.shape[0]}, "
            f"{position(int(bad[1]), value.shape[1])}); "
            "a row of the attention scores may be masked entirely."
        )
    return ""


def position(index: int, length: int | None = None) -> str:
    """A 0-based sequence index as students count it: "position 2 of 8" is the second."""
    return f"position {index + 1}" + (f" of {length}" if length is not None else "")


def compare(got: np.ndarray, expected: np.ndarray, atol: float) -> Comparison:
    """Element-wise absolute error against ``atol``; arrays have equal shapes."""
    err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    per_position = err.max(axis=(0, 2))  # (T,)
    bad = np.flatnonzero(~(per_position <= atol))  # NaN is never within tolerance
    return Comparison(
        ok=bad.size == 0,
        max_error=float(err.max()) if err.size else 0.0,
        first_bad=int(bad[0]) if bad.size else None,
        per_position=tuple(float(e) for e in per_position),
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


def signature_matches(sig: Any, observed: Any) -> bool:
    """Whether one probe's ``observed`` outcome equals a catalogued mistake's ``sig``.

    Observations are logits (an array), ``{"error": "Type: message"}`` or plain JSON
    (texts, call lists); a signature is ``{"logits": fingerprint}``, ``{"error": ...}``
    or plain JSON. Any mix is compared without raising: an array is never compared
    with ``==`` (NumPy would answer with an array, whose truth value is ambiguous).
    """
    if isinstance(observed, np.ndarray):
        return (
            isinstance(sig, dict)
            and isinstance(sig.get("logits"), list)
            and observed.ndim == 3
            and fingerprints_match(fingerprint(observed), sig["logits"])
        )
    if isinstance(sig, dict) and ("logits" in sig or "error" in sig):
        if "error" not in sig or not isinstance(observed, dict):
            return False
        return same_error_kind(observed.get("error"), sig["error"])
    try:
        return bool(sig == observed)
    except Exception:  # an observation of an unexpected type: no match
        return False


def explain(
    observed: dict[str, Any], catalogue: dict[str, dict[str, Any]], correct: set[str]
) -> tuple[list[str], bool]:
    """The catalogued mistakes that explain what the probes showed: (names, several).

    ``observed`` maps each wrong probe to what it showed, ``correct`` names the probes
    that gave the reference's result, ``catalogue`` maps each probe to the signatures of
    the mistakes that change it (a mistake absent there leaves that probe right).

    One mistake explains the probes when it matches every wrong probe and changes no
    right one; its name comes back with ``several`` False. Otherwise a pair of mistakes
    is looked for (``several`` True), each matching some probe: a wrong probe that one
    of them alone changes must show that one's signature, a probe that neither changes
    must be right, and logits equal to one mistake's signature rule out the other there
    (two mistakes that change the same logits blend them). An error raised by one of
    them may hide the other. One error shown the same way by two mistakes (a shape
    error in a chunked probe) is therefore never enough to tell them apart.
    """

    def changes(name: str, probe: str) -> bool:
        return name in catalogue.get(probe, {})

    def matches(name: str, probe: str) -> bool:
        return changes(name, probe) and signature_matches(catalogue[probe][name], observed[probe])

    probes = [*observed, *correct]
    names = sorted({n for p in probes for n in catalogue.get(p, {})})
    single = [
        n
        for n in names
        if all(matches(n, p) for p in observed) and not any(changes(n, p) for p in correct)
    ]
    if single or not observed:
        return single, False

    def pair_fits(a: str, b: str) -> bool:
        if not any(matches(a, p) for p in observed) or not any(matches(b, p) for p in observed):
            return False
        if any(changes(a, p) or changes(b, p) for p in correct):
            return False
        for p, seen in observed.items():
            by = [n for n in (a, b) if changes(n, p)]
            if not by:
                return False  # wrong, though neither mistake changes it
            if len(by) == 1 and not matches(by[0], p):
                return False
            if len(by) == 2 and isinstance(seen, np.ndarray) and (matches(a, p) or matches(b, p)):
                return False  # both change these logits: they cannot equal one's alone
        return True

    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if pair_fits(a, b)]
    if len(pairs) != 1:  # none, or several pairs fit equally: nothing certain to say
        return [], False
    return list(pairs[0]), True


def several_causes(names: list[str], diagnoses: dict[str, str]) -> list[Cause]:
    """The causes of several known mistakes present at once (none without two
    diagnoses)."""
    causes = [
        Cause(n, f"your code {diagnoses[n]}", "several mistakes fit the probes together")
        for n in names
        if n in diagnoses
    ]
    return causes if len(causes) >= 2 else []
