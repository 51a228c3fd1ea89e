"""Running Part 1's isolating experiments for a failing case, and choosing what to name.

A check calls :func:`isolate` with a case it judged wrong and the known causes it found
(:mod:`grader.parts.part1.causes`). The experiments of :mod:`grader.parts.part1.isolate`
run in the worker through the check's own cached calls, so a submission whose values
are right costs nothing more, and a failing one a few calls per failing case.

What is named:

* first, the known causes are checked against the functions the value is built from
  (the student's own weight_bytes and kv_cache_bytes_per_request for a batch): a value
  that follows from theirs names only the mistakes their values show, and an alternative
  they rule out is dropped where another is left;
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
from grader.parts.part1.causes import HARD_CODED, parts_of, twin_candidates
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
    per grading, None where it fails), the calls a value follows from, a case's plain
    answer, the tolerance, and the grading's scratch space (with the index of cases by
    call that the check's ``judge`` builds)."""

    ctx: Any
    part: str

    def own(self, call: Call) -> int | float | None: ...

    def answer(self, case: dict[str, Any]) -> dict[str, Any] | None: ...

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


def judged_case(checks: Checks, call: Call) -> tuple[Call, dict[str, Any]] | None:
    """A case that judges ``call``, or for a KV cache a case of the same spec and context
    at another bytes_per_elem (the cache is linear in it, and so is each known mistake's:
    the student's value there shows the same mistakes); with the call it judges."""
    index = checks.ctx.scratch.setdefault(f"{checks.part}.by_call", {})
    if not index:  # as the check's judge builds it: the first case of a call wins
        for c in reversed(checks.ctx.cases(checks.part)["cases"]):
            index[Call.of(c).key()] = c
    case = index.get(call.key())
    if case is not None:
        return call, case
    if call.func != "kv_cache_bytes_per_request":
        return None
    p = call.bound() or {}
    for other in index.values():
        q = Call.of(other).bound() or {}
        same = other["func"] == call.func and q.get("spec") == p.get("spec")
        if same and q.get("context_len") == p.get("context_len"):
            return Call.of(other), other
    return None


def mistakes_shown(checks: Checks, call: Call) -> tuple[set[str], set[str]] | None:
    """The known mistakes the student's own value of ``call`` shows, and those that would
    change it (by their parts); None where no case judges it or the call fails."""
    found = judged_case(checks, call)
    value = checks.own(found[0]) if found else None
    if found is None or value is None:
        return None
    case = found[1]
    verdict = Verdict(case, checks.answer(case), checks.rel_tol())
    value = int(value) if verdict.kinds() == "int" and float(value).is_integer() else value
    answer = checks.answer(case)
    stored = answer["mistakes"] if answer is not None else case["sealed"]["mistakes"]
    shown = {p for name in verdict.mistakes(value) for p in parts_of(name)}
    return shown, {p for name in stored for p in parts_of(name)}


def upstream_known(checks: Checks, upstream: list[Call], known: list[Cause]) -> list[Cause]:
    """The known causes of a knock-on value that are mistakes of the functions it follows
    from, as the student's own values of those calls show them. Another known mistake that
    happens to give the same batch (a TP mistake beside a KV cache sized as MHA) is a
    coincidence, not named. All of ``known`` where a call it follows from is not judged."""
    parts: set[str] = set()
    for call in upstream:
        seen = mistakes_shown(checks, call)
        if seen is None:
            return known
        parts |= seen[0]
    return [c for c in known if parts_of(c.id) <= parts]


def contradicted(checks: Checks, uses: list[Call], known: list[Cause]) -> list[Cause]:
    """``known`` without the alternatives that the functions a value is built from rule
    out: a mistake of one of them (it would change its value) that the student's own value
    of it does not show. Only where another alternative is left: a value computed inline
    may hold a mistake its function does not."""
    ruled_out: set[str] = set()
    for call in uses:
        seen = mistakes_shown(checks, call)
        if seen is not None:
            ruled_out |= seen[1] - seen[0]
    left = [c for c in known if not parts_of(c.id) & ruled_out]
    return left or known


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
        return list(dict.fromkeys(found)) or upstream_known(checks, upstream, known)
    known = contradicted(checks, uses[0], known) if uses and len(known) > 1 else known
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
