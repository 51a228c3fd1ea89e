"""Knock-on failures in Part 1: a wrong value that follows from another function's.

The calculator's functions build on each other: ``weight_bytes`` on ``param_count``,
``max_batch_size`` on ``weight_bytes`` and ``kv_cache_bytes_per_request``,
``arithmetic_intensity`` on ``attention_flops`` and ``attention_bytes``, and the answer
table on all of them. One wrong ``attention_bytes`` fails 1.7, 1.8, 1.9 and 1.10. So a
failing value is rebuilt from the student's own values of the functions it builds on
(:func:`derivation`; for a table entry, the case's ``entries_from``): where the
student's value is exactly that and one of those values is wrong, the feedback points
back to that function's check ("This follows from 1.7's attention_bytes; fix that
first.") instead of leaving the student to look for a second bug.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grader.judging.base import values_match

#: Each function's parameters in the handout's order, with defaults: calls that differ only
#: in how they pass an argument are the same call.
SIGNATURES: dict[str, tuple[tuple[str, Any], ...]] = {
    "param_count": (("spec", None),),
    "weight_bytes": (("spec", None),),
    "kv_cache_bytes_per_request": (("spec", None), ("context_len", None), ("bytes_per_elem", 2)),
    "max_batch_size": (("spec", None), ("gpu_mem_bytes", None), ("context_len", None), ("tp", 1)),
    "attention_flops": (("N", None), ("d", None), ("phase", None)),
    "attention_bytes": (("N", None), ("d", None), ("phase", None), ("bpe", 2)),
    "arithmetic_intensity": (
        ("N", None),
        ("d", None),
        ("phase", None),
        ("bpe", 2),
        ("batch", 1),
    ),
}

#: The write-up check of each function (``max_batch_size`` with tp > 1: 1.5).
FUNC_CHECK = {
    "param_count": "1.1",
    "weight_bytes": "1.2",
    "kv_cache_bytes_per_request": "1.3",
    "max_batch_size": "1.4",
    "attention_flops": "1.6",
    "attention_bytes": "1.7",
    "arithmetic_intensity": "1.8",
}


@dataclass(frozen=True)
class Call:
    """One call of a calculator function, as a case states it."""

    func: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, case: Mapping[str, Any]) -> Call:
        return cls(case["func"], tuple(case["args"]), tuple(sorted(case["kwargs"].items())))

    def bound(self) -> dict[str, Any] | None:
        """Every parameter's value, defaults filled in (None for an unknown function or
        arguments that do not fit its signature)."""
        signature = SIGNATURES.get(self.func)
        if signature is None or len(self.args) > len(signature):
            return None
        values = dict(zip((p for p, _ in signature), self.args, strict=False))
        for param, default in signature[len(self.args) :]:
            values[param] = dict(self.kwargs).get(param, default)
        return values

    def key(self) -> str:
        """The same for the same call, however its arguments are passed."""
        return json.dumps([self.func, self.bound()], sort_keys=True)

    def header(self) -> dict[str, Any]:
        """The worker request that makes this call."""
        return {
            "op": "call",
            "func": self.func,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
        }

    def check(self) -> str:
        """The write-up check that judges this function."""
        if self.func == "max_batch_size" and (self.bound() or {}).get("tp", 1) > 1:
            return "1.5"
        return FUNC_CHECK.get(self.func, "")


Formula = Callable[[Sequence[float]], float]


def _max_batch(tp: int, gpu: int) -> Formula:
    def batch(values: Sequence[float]) -> float:
        weights, per_request = values
        return max((tp * gpu - weights) // per_request, 0) if per_request > 0 else float("nan")

    return batch


def derivation(call: Call) -> tuple[list[Call], Formula] | None:
    """The calls ``call``'s value is computed from, and how (the handout's formulas)."""
    p = call.bound()
    if p is None:
        return None
    if call.func == "weight_bytes":
        bpp = p["spec"]["__spec__"].get("bytes_per_param", 2)
        return [Call("param_count", (p["spec"],))], lambda v: v[0] * bpp
    if call.func == "max_batch_size":
        bpp = p["spec"]["__spec__"].get("bytes_per_param", 2)
        uses = [
            Call("weight_bytes", (p["spec"],)),
            Call("kv_cache_bytes_per_request", (p["spec"], p["context_len"], bpp)),
        ]
        return uses, _max_batch(p["tp"], p["gpu_mem_bytes"])
    if call.func == "arithmetic_intensity":
        n, d, phase, bpe = p["N"], p["d"], p["phase"], p["bpe"]
        uses = [Call("attention_flops", (n, d, phase)), Call("attention_bytes", (n, d, phase, bpe))]
        return uses, lambda v: v[0] / v[1] if v[1] else float("nan")
    return None


def entry_derivation(source: Mapping[str, Any]) -> tuple[list[Call], Formula]:
    """A table entry's call (an ``entries_from`` item) and its scale."""
    scale = source["scale"]
    return [Call.of(source)], lambda v: v[0] * scale


#: The student's value of a call (None where it could not be had), and whether a value of
#: a call is right (None where no case judges that call).
Own = Callable[[Call], Any]
Judge = Callable[[Call, Any], bool | None]


def follows_from(
    got: Any, uses: tuple[list[Call], Formula], own: Own, judge: Judge, rel_tol: float
) -> list[Call]:
    """The calls whose wrong values ``got`` follows from: ``got`` is the formula applied to
    the student's own values of ``uses``, and those calls are wrong (or, where no case
    judges any of them, all of them: one at least is wrong, as the formula applied to the
    right values gives the right answer). Empty when ``got`` is not a knock-on."""
    calls, formula = uses
    values = [own(c) for c in calls]
    if any(v is None for v in values):
        return []
    try:
        rebuilt = formula(values)
    except (ArithmeticError, TypeError, ValueError):
        return []
    if not values_match(float(got), float(rebuilt), rel_tol):
        return []
    verdicts = [judge(c, v) for c, v in zip(calls, values, strict=True)]
    wrong = [c for c, ok in zip(calls, verdicts, strict=True) if ok is False]
    if wrong:
        return wrong
    return [c for c, ok in zip(calls, verdicts, strict=True) if ok is None]


def pointer(calls: Sequence[Call]) -> str:
    """ "1.7's attention_bytes" (and "1.6's attention_flops and ..."), each once."""
    names = dict.fromkeys(f"{c.check()}'s {c.func}" for c in calls)
    return " and ".join(names)


def knock_on_sentence(calls: Sequence[Call], entries: Sequence[str] = ()) -> str:
    """ "This follows from 1.7's attention_bytes; fix that first." ("" for no calls), or
    for table ``entries``: "weight_gib follows from 1.2's weight_bytes; ..."."""
    if not calls:
        return ""
    that = "that" if len({(c.check(), c.func) for c in calls}) == 1 else "those"
    subject = " and ".join(entries) or "This"
    verb = "follow" if len(entries) > 1 else "follows"
    return f"{subject} {verb} from {pointer(calls)}; fix {that} first."


def number(enc: Any) -> int | float | None:
    """A worker's encoded int or finite float as a number (None for anything else): a
    value the student's function returned, to rebuild another from."""
    if not isinstance(enc, dict) or enc.get("kind") not in ("int", "float"):
        return None
    value = enc.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if value == value and abs(value) != float("inf") else None
