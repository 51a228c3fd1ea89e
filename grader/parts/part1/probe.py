"""Running Part 1's isolating experiments for a failing case, and choosing what to name.

A check calls :func:`isolate` with a case it judged wrong and the known causes it found
(:mod:`grader.parts.part1.causes`). The experiments of :mod:`grader.parts.part1.isolate`
run in the worker through the check's own cached calls, so a submission whose values
are right costs nothing more, and a failing one a few calls per failing case.

What is named:

* a decisive finding (an argument ignored, a batch rounded or negative) replaces the
  known causes: the evidence singles it out, and no known mistake ignores an argument;
* otherwise the known causes, except a value "written in" when varying an input moved
  the value (it is computed, not written in), each with its twin where the experiment
  that tells them apart gave no answer (:data:`grader.parts.part1.causes.TWINS`);
* where no known cause is left, the findings that narrow the place (a factor or a
  difference in the spec's quantities, an argument the value depends on wrongly).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from grader.core.feedback_items import Cause
from grader.parts.part1.causes import HARD_CODED, twin_candidates
from grader.parts.part1.isolate import (
    Finding,
    batch_findings,
    experiments,
    read_experiment,
    spec_of,
    value_findings,
)
from grader.parts.part1.knock_on import Call, derivation
from grader.parts.part1.seal import Verdict


class Checks(Protocol):
    """What :func:`isolate` uses of a Part 1 check: the student's value of a call (cached
    per grading, None where it fails), the calls a value follows from, the tolerance, and
    the grading's scratch space."""

    ctx: Any

    def own(self, call: Call) -> int | float | None: ...

    def follows(self, got: Any, uses: Any) -> list[Call]: ...

    def rel_tol(self) -> float: ...


def judge(verdict: Verdict) -> Any:
    """The case's verdict as a test of a candidate value: an int case takes whole values
    only (as ints), a float case any finite value."""
    kind = verdict.kinds()

    def is_right(value: float) -> bool:
        if not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if kind == "int":
            whole = round(value)
            return abs(value - whole) <= 1e-9 * max(1.0, abs(value)) and verdict.right(int(whole))
        return verdict.right(float(value))

    return is_right


def quotient(checks: Checks, call: Call) -> float | None:
    """For a max_batch_size call: the group's free memory over one request's cache, from
    the student's own weight_bytes and kv_cache_bytes_per_request (None where either
    fails or the cache is not positive)."""
    p = call.bound()
    spec = spec_of(p or {})
    if p is None or spec is None:
        return None
    bpp = spec.get("bytes_per_param", 2)
    weights = checks.own(Call("weight_bytes", (p["spec"],)))
    per_request = checks.own(Call("kv_cache_bytes_per_request", (p["spec"], p["context_len"], bpp)))
    if weights is None or per_request is None or per_request <= 0:
        return None
    return (p["tp"] * p["gpu_mem_bytes"] - weights) / per_request


def experiment_findings(
    checks: Checks, call: Call, got: float
) -> tuple[list[Finding], bool, set[str]]:
    """What varying each argument alone shows, whether some variation moved the student's
    value, and the arguments whose experiments gave an answer."""
    found, moved, decided = [], False, set()
    for exp in experiments(call):
        before = got if exp.base is None else checks.own(exp.base)
        after = checks.own(exp.call)
        if before is None or after is None:
            continue
        decided.add(exp.arg)
        moved |= not math.isclose(after, before, rel_tol=checks.rel_tol())
        finding = read_experiment(call, exp, before, after, checks.rel_tol())
        if finding is not None:
            found.append(finding)
    return found, moved, decided


def isolate(
    checks: Checks, case: dict[str, Any], verdict: Verdict, got: Any, known: list[Cause]
) -> list[Cause]:
    """The causes to name for a failing case whose wrong value is ``got``: ``known``
    (the catalogue's) checked and completed by the isolating experiments. A value that
    follows from another function's wrong value is named by that function's decisive
    finding where one was made, else by its known causes. A decisive finding is the
    function's for the whole grading: its other failing cases name it too, and no known
    mistake."""
    if isinstance(got, bool) or not isinstance(got, int | float):
        return known
    call = Call.of(case)
    states = checks.ctx.scratch.setdefault("part1.isolated", {})
    state = states.setdefault(call.func, {})
    if state.get("decisive"):
        return state["decisive"]
    uses = derivation(call)
    upstream = checks.follows(got, uses) if uses else []
    if upstream:  # the functions it follows from: their decisive causes, where found
        found = [c for u in upstream for c in states.get(u.func, {}).get("decisive", [])]
        return list(dict.fromkeys(found)) or known
    found, moved, decided = experiment_findings(checks, call, got)
    if call.func == "max_batch_size" and not any(f.decisive for f in found):
        found += batch_findings(got, judge(verdict), quotient(checks, call))
    causes = state.setdefault("causes", {})  # one sentence per id: named once a check
    decisive = [causes.setdefault(f.cause.id, f.cause) for f in found if f.decisive]
    if decisive:
        state["decisive"] = list(dict.fromkeys(decisive))
        return state["decisive"]
    kept = [c for c in known if not (moved and c.id == HARD_CODED)]
    if kept:
        return kept + twin_candidates(kept, call.bound() or {}, decided)
    # nothing known is left: the place, by experiment, else by the value alone (judged
    # against the expected value candidate by candidate, so only where it is needed)
    found = found or value_findings(call, got, judge(verdict))
    return list(dict.fromkeys(causes.setdefault(f.cause.id, f.cause) for f in found))
