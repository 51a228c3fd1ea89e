"""Part 1 diagnosis by isolation: a wrong number explained against the inputs it was
computed from, and the argument a function ignores found by varying it alone.

The mutant library names the mistakes it was told about; this module answers for the
others, and decides between explanations that give the same value, the way a TA
debugs. Everything here is pure: the checks (:mod:`grader.parts.part1.probe`) run the
calls it asks for in the worker and hand back the student's values.

* :func:`value_findings` compares the wrong value with the right one in the spec's own
  quantities: a factor (``n_layers``, 2, ``n_q_heads / n_kv_heads``, ``bytes_per_elem``,
  2^30 / 10^9, ...), a difference (exactly ``d_model``, ``vocab_size * d_model``, one
  ``N x d`` matrix), rounding instead of flooring, a negative batch where 0 is right.
  The right value is never needed in plain form: ``is_right`` judges a candidate, so
  the self-check's sealed cases are explained as Gradescope's plain ones are.
* :func:`experiments` lists the calls that vary one argument of a failing call, and
  how the right value responds (from the handout's closed forms: a ratio, or "it
  changes"); :func:`read_experiment` says what the student's response shows.

A finding is ``decisive`` where the evidence singles out its cause against every known
mistake: no mistake of the library ignores an argument (``tests/parts/part1/
test_isolate.py`` checks each one), so a value that does not move with an argument the
right value depends on is none of them, whatever value it happens to equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from grader.core.feedback_items import Cause
from grader.parts.part1.knock_on import Call

#: Judges a candidate right value (the case's expected value, plain or sealed).
IsRight = Callable[[float], bool]

GIB_PER_GB = 2**30 / 10**9

#: How much more of the group's memory the TP experiment gives (tp times this): enough
#: for the weights of any spec the cases draw, on the smallest GPU they draw.
TP_SCALE = 64


@dataclass(frozen=True)
class Finding:
    """One explanation of a wrong value: the cause it states, and whether the evidence
    singles it out (known mistakes that give the same value are then not named)."""

    cause: Cause
    decisive: bool = False


@dataclass(frozen=True)
class Experiment:
    """One argument of a call varied alone: the varied call, the words for the change,
    and the right value's response: ``ratio`` (new / old) where the handout's formula
    gives one, or ``None`` where it only says the right value grows. ``base`` is the call
    compared with where it is not the case's own (the TP experiment's short context)."""

    arg: str
    call: Call
    change: str
    ratio: float | None
    base: Call | None = None


def spec_of(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model spec's fields of a bound call (None for the attention functions)."""
    spec = params.get("spec")
    return dict(spec["__spec__"]) if isinstance(spec, dict) and "__spec__" in spec else None


def _head_dim(spec: Mapping[str, Any]) -> int:
    return spec["d_model"] // spec["n_q_heads"]


def kv_elements(spec: Mapping[str, Any], context_len: int) -> int:
    """Elements of K and V one request caches: the handout's formula without the bytes."""
    return 2 * spec["n_layers"] * spec["n_kv_heads"] * _head_dim(spec) * context_len


# ------------------------------------------------------------------ value findings


def _factors(func: str, p: Mapping[str, Any]) -> Iterator[tuple[str, str, float]]:
    """(key, the factor in the spec's words, its value) a wrong value may be off by."""
    yield "2", "2", 2
    spec = spec_of(p)
    if spec is not None:
        yield "n_layers", "n_layers", spec["n_layers"]
        yield "gqa_ratio", "n_q_heads / n_kv_heads", spec["n_q_heads"] / spec["n_kv_heads"]
        yield "head_dim", "head_dim", _head_dim(spec)
        yield "bytes_per_param", "bytes_per_param", spec.get("bytes_per_param", 2)
    if func == "kv_cache_bytes_per_request":
        yield "bytes_per_elem", "bytes_per_elem", p["bytes_per_elem"]
        yield (
            "precision",
            "bytes_per_elem / bytes_per_param",
            p["bytes_per_elem"] / (spec or {}).get("bytes_per_param", 2),
        )
        yield "context_len", "context_len", p["context_len"]
    if "N" in p:
        yield "N", "N", p["N"]
        yield "d", "d", p["d"]
    if "bpe" in p:
        yield "bpe", "bpe", p["bpe"]
    yield "gib_gb", "2^30 / 10^9 (GiB against GB)", GIB_PER_GB


def _differences(func: str, p: Mapping[str, Any]) -> Iterator[tuple[str, str, float]]:
    """(key, the amount in the spec's words, its value) a wrong value may be short by."""
    spec = spec_of(p)
    if func == "param_count" and spec is not None:
        d, layers = spec["d_model"], spec["n_layers"]
        yield "d_model", "d_model (one RMSNorm weight vector, such as the final norm)", d
        yield (
            "vocab_d_model",
            "vocab_size * d_model (one embedding-sized matrix)",
            (spec["vocab_size"] * d),
        )
        yield "layer_norms", "n_layers * d_model (one norm vector per layer)", layers * d
        yield "d_model_sq", "n_layers * d_model^2 (one d x d matrix per layer)", layers * d * d
        yield (
            "d_ff",
            "n_layers * d_model * d_ff (one FFN matrix per layer)",
            (layers * d * spec["d_ff"]),
        )
    if func == "attention_bytes":
        n, d, bpe = p["N"], p["d"], p["bpe"]
        yield "n_d", "N * d * bpe bytes (one N x d matrix: Q, K, V or O)", n * d * bpe
        yield "d", "d * bpe bytes (one d-vector: q or o)", d * bpe
        yield "n", "N * bpe bytes (one row of S or P)", n * bpe
        yield "n_n", "N^2 * bpe bytes (one N x N matrix: S or P)", n * n * bpe


def _factor_findings(func: str, p: Mapping[str, Any], got: float, is_right: IsRight):
    """The factors that turn ``got`` into the right value, by the factor's value: where
    two of the spec's quantities are equal (2 and bytes_per_elem / bytes_per_param), the
    value alone cannot tell them apart, and they are named together."""
    by_value: dict[tuple[str, float], list[tuple[str, str]]] = {}
    for key, words, f in _factors(func, p):
        if f in (0, 1) or not math.isfinite(f):
            continue
        for way, candidate in (("small", got * f), ("large", got / f)):
            if is_right(candidate):
                by_value.setdefault((way, f), []).append((key, words))
    for (way, f), named in by_value.items():
        keys = "_or_".join(k for k, _ in named)
        words = " or ".join(w for _, w in named)
        alike = " (the value alone cannot tell these apart)" if len(named) > 1 else ""
        text = (
            f"your {func} is a factor of {words} too {way}{alike}: look for where that "
            "quantity enters (or should enter) the formula"
        )
        op = "times" if way == "small" else "divided by"
        evidence = f"your value {op} {f:g} is the right one"
        yield Finding(Cause(f"isolated:factor_{keys}", text, evidence))


def value_findings(
    call: Call, got: float, is_right: IsRight, quotient: float | None = None
) -> list[Finding]:
    """What the wrong value ``got`` of ``call`` is against the right one: a factor or a
    difference in the spec's quantities, a batch rounded (``quotient``: the student's own
    free memory over one request's cache) or negative where the right batch is 0."""
    p = call.bound()
    if p is None or not isinstance(got, int | float) or not math.isfinite(got):
        return []
    found: list[Finding] = []
    if call.func == "max_batch_size":
        found += batch_findings(got, is_right, quotient)
        if found:
            return found
    found += list(_factor_findings(call.func, p, got, is_right))
    for key, words, amount in _differences(call.func, p):
        for way, candidate in (("short", got + amount), ("over", got - amount)):
            if is_right(candidate):
                text = f"your {call.func} is {way} by exactly {words}"
                op = "plus" if way == "short" else "minus"
                evidence = f"your value {op} {amount:,} is the right one"
                found.append(Finding(Cause(f"isolated:{way}_by_{key}", text, evidence)))
    return found


def batch_findings(got: float, is_right: IsRight, quotient: float | None) -> list[Finding]:
    """A batch that is negative where 0 is right, or the student's own quotient rounded
    (or rounded up) where floored it is right."""
    if got < 0 and is_right(0):
        text = (
            "your max_batch_size returns a negative batch when the weights do not fit; the "
            "handout asks for 0 then (max(..., 0))"
        )
        return [Finding(Cause("isolated:negative_batch", text, f"{got:,} where 0 is"), True)]
    if quotient is None or not math.isfinite(quotient) or quotient < 0:
        return []
    floor = math.floor(quotient)
    if floor == got or math.ceil(quotient) != got or not is_right(floor):
        return []
    how = "rounds up" if quotient - floor < 0.5 else "rounds (to the nearest or up)"
    text = (
        f"your max_batch_size {how} the number of caches that fit where the handout floors "
        "it: only whole requests fit in the free memory"
    )
    evidence = (
        f"your own weight_bytes and kv_cache_bytes_per_request give {quotient:,.3f} caches; "
        f"floored that is right, and you returned {got:,}"
    )
    return [Finding(Cause("isolated:not_floored", text, evidence), True)]


# --------------------------------------------------------------------- experiments


def _with(call: Call, **changes: Any) -> Call:
    """``call`` with some parameters (or spec fields, under ``spec``) changed, passed
    by position in the handout's order."""
    p = dict(call.bound() or {})
    spec_changes = changes.pop("spec", None)
    if spec_changes:
        p["spec"] = {"__spec__": {**p["spec"]["__spec__"], **spec_changes}}
    p.update(changes)
    return Call(call.func, tuple(p.values()))


def _attention_ratio(func: str, phase: str, n: int, d: int, n2: int, d2: int) -> float:
    """How the handout's attention FLOPs change from (N, d) to (N2, d2)."""
    if func == "attention_flops":
        return (n2 * n2 * d2) / (n * n * d) if phase == "prefill" else (n2 * d2) / (n * d)
    return float("nan")


def experiments(call: Call) -> list[Experiment]:
    """The one-argument variations of ``call`` that can show an argument ignored or
    used wrongly, each with the right value's response."""
    p = call.bound()
    if p is None:
        return []
    spec, f = spec_of(p), call.func
    out: list[Experiment] = []
    if f == "kv_cache_bytes_per_request" and spec is not None:
        out += [
            _doubled(call, "bytes_per_elem", p["bytes_per_elem"], 2.0),
            _doubled(call, "context_len", p["context_len"], 2.0),
            _doubled(call, "n_layers", spec["n_layers"], 2.0, in_spec=True),
        ]
    elif f == "weight_bytes" and spec is not None:
        out.append(
            _doubled(call, "bytes_per_param", spec.get("bytes_per_param", 2), 2.0, in_spec=True)
        )
    elif f == "max_batch_size" and spec is not None:
        out += _tp_experiment(call, p, spec)
    elif f in ("attention_flops", "attention_bytes", "arithmetic_intensity"):
        out += _attention_experiments(call, p)
    return out  # fmt: skip


def _tp_experiment(call: Call, p: Mapping[str, Any], spec: Mapping[str, Any]) -> list[Experiment]:
    """Many times the GPUs, at a context of one token: the group then holds the weights
    and far more requests, so the right batch grows. The short context makes one
    request's cache small against the weights, so that a batch whose weights are split
    wrongly (a known mistake) moves with tp too: only one that ignores tp stays put."""
    tp, gpu = p["tp"], p["gpu_mem_bytes"]
    per_request = kv_elements(spec, 1) * spec.get("bytes_per_param", 2)
    if (TP_SCALE - 1) * tp * gpu < per_request:
        return []
    more, base = TP_SCALE * tp, _with(call, context_len=1)
    change = f"{TP_SCALE} times the GPUs (tp {tp} to {more}, at a context of 1 token)"
    return [Experiment("tp", _with(base, tp=more), change, None, base)]


def _attention_experiments(call: Call, p: Mapping[str, Any]) -> list[Experiment]:
    n, d, phase = p["N"], p["d"], p["phase"]
    if call.func == "attention_flops":
        return [
            _doubled(call, "N", n, _attention_ratio(call.func, phase, n, d, 2 * n, d)),
            _doubled(call, "d", d, _attention_ratio(call.func, phase, n, d, n, 2 * d)),
        ]
    return [_doubled(call, "bpe", p["bpe"], 2.0 if call.func == "attention_bytes" else 0.5)]


def _doubled(call: Call, arg: str, was: Any, ratio: float, *, in_spec: bool = False) -> Experiment:
    """``call`` with one argument (or, ``in_spec``, one field of its spec) doubled alone,
    and the right value's response to it."""
    change = {"spec": {arg: 2 * was}} if in_spec else {arg: 2 * was}
    name = f"spec.{arg}" if in_spec else arg
    words = f"doubling {name} ({was:,} to {2 * was:,})"
    return Experiment(arg, _with(call, **change), words, ratio)


def _response(ratio: float | None) -> str:
    if ratio is None:
        return "the right value grows"
    if ratio == 2:
        return "the right value doubles"
    if ratio == 0.5:
        return "the right value halves"
    return f"the right value is multiplied by {ratio:g}"


def read_experiment(
    call: Call, exp: Experiment, before: float, after: float | None, rel_tol: float
) -> Finding | None:
    """What the student's values ``before`` and ``after`` the variation show: an argument
    ignored (decisive), or one the value depends on other than the handout's formula
    does (the place to look). None where the value responds as the right one does, or
    the varied call gave no number."""
    if after is None or not math.isfinite(after) or before == 0:
        return None
    same = math.isclose(after, before, rel_tol=rel_tol)
    if same and exp.ratio != 1:
        text = (
            f"your {call.func} ignores {exp.arg}: {exp.change.split(' (')[0]} left your "
            f"value unchanged, where {_response(exp.ratio)}"
        )
        evidence = f"{exp.change}: {before:,.6g} both times"
        return Finding(Cause(f"isolated:ignores_{exp.arg}", text, evidence), decisive=True)
    if exp.ratio is None or math.isclose(after / before, exp.ratio, rel_tol=1e-9):
        return None
    measured = after / before
    text = (
        f"your {call.func} depends on {exp.arg} in another way than the handout's formula: "
        f"{exp.change.split(' (')[0]} multiplied your value by {measured:.6g}, where "
        f"{_response(exp.ratio)}"
    )
    evidence = f"{exp.change}: {before:,.6g} to {after:,.6g}"
    return Finding(Cause(f"isolated:{exp.arg}_dependence", text, evidence))
