"""Where a wrong forward goes wrong, narrowed by experiment after a check of logits failed.

When a check of forward (2.2 to 2.7) finds wrong logits and no known mistake explains
them, the grader varies one thing at a time on inputs it chooses, with the reference's
values from :mod:`reference_np` (checked first against the stored cases):

1. **The plan**: one seeded prompt of the failing case's model, batch 1, without the cache,
   with the cache in one call, one token at a time and a prefill then chunks: which plans
   are right, and for the others the first call that departs (the prompt right and a later
   step wrong points at the cache or the positions of a cached call).
2. **The piece**: the first departing plan runs again with every decoder layer, attention
   and feed-forward block recorded (``adapter_trace``); each is recomputed on the very input
   it was given (:mod:`pieces`), and the first that departs is named, with what it computed
   where a hypothesis tested on the same input fits (the positions it embedded at, the keys
   its attention saw, what the cache it read holds, against the keys and values of the
   tokens seen: which layer, keys or values, which positions).
3. **The batch and the length**, when every plan is right for one short prompt: three
   different prompts in one batch against each alone, then one prompt of ``max_seq_len``.

A cause is stated only for what an experiment showed; where nothing departs, or the trace
cannot tell, nothing is said. Run once per grading and model, only after a failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.parts.part2 import isolate, wording
from grader.parts.part2.pieces import PlanResult, first_departure
from grader.parts.part2.reference_np import Reference, trustworthy
from grader.parts.part2.support import checked_weights
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part2.support import Part2Base

PROBE_SEED, PROBE_LEN, BATCH_ROWS = 6262, 10, 3


def plans(length: int) -> list[tuple[str, list[int] | None]]:
    first = max(1, length - 6)
    chunks = [first] + [3] * ((length - first) // 3) + [(length - first) % 3]
    return [
        ("without the cache", None),
        ("with the cache in one call", [length]),
        ("one token at a time", [1] * length),
        (f"a prefill of {first}, then chunks of 3", [n for n in chunks if n]),
    ]


def reference(check: Part2Base, model: str) -> Reference | None:
    """The reference model of ``model``'s weights, None when it fails its own check."""
    trusted = check.ctx.scratch.setdefault("part2.reference_trusted", {})
    spec = check.model_spec(model)
    if "weights" not in spec and spec.get("on_device"):
        return None
    weights = check.ctx.seeded_weights(check.part, spec, lambda: checked_weights(spec, model))
    ref = Reference(weights)
    if "public" not in trusted:
        public = check.model_spec("public")
        w = check.ctx.seeded_weights(check.part, public, lambda: checked_weights(public, "public"))
        trusted["public"] = trustworthy(Reference(w), check.course_cases(), check.atol())
    return ref if trusted["public"] else None


def run_plan(
    check: Part2Base, model: str, ids: np.ndarray, label: str, steps: list[int] | None, want: Any
) -> PlanResult:
    try:
        got, _ = check.forward(model, ids, steps, what=f"forward (isolation, {label})")
    except SubmissionError as exc:
        return PlanResult(label, steps, raised=exc.signature or exc.kind)
    if not isinstance(got, np.ndarray) or got.shape != want.shape:
        return PlanResult(label, steps, raised="logits of another shape")
    err = np.abs(got.astype(np.float64) - want).max(axis=(0, 2))
    bad = np.flatnonzero(~(err <= check.atol()))
    if not bad.size:
        return PlanResult(label, steps)
    pos = int(bad[0])
    call = 0 if steps is None else int(np.searchsorted(np.cumsum(steps), pos, side="right"))
    return PlanResult(label, steps, call, pos, float(np.nanmax(err, initial=0.0)))


def probe_ids(check: Part2Base, model: str, rows: int, length: int) -> np.ndarray:
    vocab = check.model_spec(model)["config"]["vocab_size"]
    rng = np.random.default_rng([PROBE_SEED, rows, length, vocab])
    return rng.integers(0, vocab, size=(rows, length), dtype=np.int64)


def narrow_forward(check: Part2Base, model: str) -> tuple[list[Cause], list[str]]:
    """The causes and lines the experiments above single out for ``model`` (once per
    grading and model); nothing when the reference cannot be trusted or nothing departs.
    Never raises."""
    memo = check.ctx.scratch.setdefault("part2.isolated_forward", {})
    if model not in memo:
        try:
            memo[model] = experiments(check, model)
        except Exception:  # an optional hint: the check's own message stands without it
            memo[model] = ([], [])
    return memo[model]


def experiments(check: Part2Base, model: str) -> tuple[list[Cause], list[str]]:
    ref = reference(check, model)
    config = check.model_spec(model)["config"]
    if ref is None:
        return [], []
    length = min(PROBE_LEN, config["max_seq_len"])
    ids = probe_ids(check, model, 1, length)
    want = ref.logits(ids)
    results = [run_plan(check, model, ids, label, s, want) for label, s in plans(length)]
    line = wording.plans_line(results, length, model)
    wrong = [r for r in results if not r.right and not r.raised]
    if not wrong:
        if any(r.raised for r in results):
            return [], [line]
        return rows_and_length(check, model, ref, length)
    first = wrong[0]
    steps = first.steps or [length]
    header = {"op": "trace", "model": model, "steps": first.steps, "layers": ref.layers}
    try:
        reply = check.call(header, {"input_ids": ids}, what=f"forward (isolation, {first.label})")
    except SubmissionError:
        return [], [line]
    found = first_departure(ref, reply.arrays, ids, steps, check.atol())
    if found is None:
        return [], [line]
    right_first = first.call is not None and first.call > 0
    cause = wording.finding_cause(found, first.label, steps, right_first)
    if model != "public" and all(r.right for r in public_plans(check)):
        line += " The same plans on the public model, of other sizes, are right."
    return [cause], [line, f"{wording.PIECE} {cause.evidence}."]


def public_plans(check: Part2Base) -> list[PlanResult]:
    """The plans on the public model (a hidden model's failure: do the sizes matter?)."""
    ref = reference(check, "public")
    if ref is None:
        return []
    ids = probe_ids(check, "public", 1, PROBE_LEN)
    want = ref.logits(ids)
    return [run_plan(check, "public", ids, label, s, want) for label, s in plans(PROBE_LEN)]


def rows_and_length(
    check: Part2Base, model: str, ref: Reference, length: int
) -> tuple[list[Cause], list[str]]:
    """Every plan right for one short prompt: a batch of different prompts, then one of
    ``max_seq_len`` tokens, each against the reference."""
    batch = probe_ids(check, model, BATCH_ROWS, length)
    want = ref.logits(batch)
    for label, steps in plans(length)[::3]:  # without the cache, and in chunks
        try:
            got, _ = check.forward(model, batch, steps, what=f"forward (isolation, {label})")
        except SubmissionError:
            continue
        if not isinstance(got, np.ndarray) or got.shape != want.shape:
            continue
        errs = np.abs(got.astype(np.float64) - want).max(axis=(1, 2))
        rows = np.flatnonzero(~(errs <= check.atol()))
        if rows.size:
            evidence = (
                f"{BATCH_ROWS} different prompts of {length} tokens in one batch, {label}, "
                f"each right alone: row {int(rows[0]) + 1} of {BATCH_ROWS} departs from the "
                f"reference's logits by up to {float(np.nanmax(errs)):.3g}"
            )
            return [isolate.batch_cause(evidence)], [f"{wording.NARROWED} {evidence}."]
    n = check.model_spec(model)["config"]["max_seq_len"]
    if n <= length:
        return [], []
    long_ids = probe_ids(check, model, 1, n)
    long_want = ref.logits(long_ids)
    for label, steps in (("without the cache", None), ("one token at a time", [1] * n)):
        result = run_plan(check, model, long_ids, label, steps, long_want)
        if result.pos is not None:
            cause = wording.long_cause(result, length, n)
            return [cause], [f"{wording.NARROWED} {cause.evidence}."]
    return [], []
