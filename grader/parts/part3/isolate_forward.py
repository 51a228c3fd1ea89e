"""Where a wrong Part 3 forward goes wrong, narrowed by experiment after a check failed.

When a check of forward logits (3.2, 3.3, 3.4) fails and no known mistake explains it, the
grader varies one thing at a time on tokens it chooses, against its own model
(:mod:`.reference`, trusted only after it gives the stored cases):

1. **The plan**: one seeded prompt, batch 1, without the cache, with the cache in one call,
   a prefill then one token per call, a prefill then chunks: which are right, and for the
   others the first call that departs (the prompt against the first and later decode steps;
   one token at a time against chunks and the whole prompt at once).
2. **The piece**: every plan runs with each stage of Meta's layer structure recorded
   (``adapter_isolate``), and each piece is recomputed on the very input it was given
   (:mod:`.pieces`): the first that departs is named (which layer, the attention or the
   feed-forward, the norms or residual sums around them, the embeddings or the output).
3. **The batch and the length**, when every plan is right for one short prompt: three
   different prompts in one batch against each alone, then one prompt of ``max_seq_len``.

A cause is stated only for what an experiment showed; where nothing departs, or the record
cannot tell, nothing is said. Run once per grading and model, only after a failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from grader.core.arrays import decode_array
from grader.core.feedback_items import Cause
from grader.judging.logits import compare
from grader.parts.part3 import wording
from grader.parts.part3.cases import N_RANKS, plans
from grader.parts.part3.course import UNSCALED
from grader.parts.part3.pieces import PlanRun, departure, first_departure
from grader.parts.part3.reference import ReferenceLlama, ReferenceUnavailable
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part3.support import Part3Base

PROBE_SEED, PROBE_LEN, BATCH_ROWS = 7373, 12, 3


def spec_of(check: Part3Base, model: str) -> dict[str, Any]:
    return check.raw()["models"][model]


def references(check: Part3Base, model: str) -> list[ReferenceLlama]:
    """The grader's models of ``model``'s weights, the submission's RoPE convention first
    (then the other): none where the weights cannot be drawn as stored or the model does
    not give the stored logits of its first case."""
    memo = check.ctx.scratch.setdefault("part3.references", {})
    if model not in memo:
        memo[model] = trusted_references(check, model)
    refs = memo[model]
    return refs[::-1] if check.rope() == UNSCALED else refs


def trusted_references(check: Part3Base, model: str) -> list[ReferenceLlama]:
    spec = spec_of(check, model)
    try:
        refs = [ReferenceLlama.of(spec, scaled) for scaled in (True, False)]
    except (ReferenceUnavailable, KeyError):
        return []
    case = next((c for c in check.raw()["cases"] if c["model"] == model), None)
    if case is None:
        return []
    tokens = np.array(case["tokens"], dtype=np.int64)
    for ref, key in zip(refs, ("expected", "expected_unscaled"), strict=True):
        got = ref.logits(tokens)[:, case["positions"]]
        if key not in case or not compare(got, decode_array(case[key]), check.atol()).ok:
            return []
    return refs


def probe_ids(check: Part3Base, rows: int, length: int) -> np.ndarray:
    """Seeded tokens of the public tokenizer's ranks, BOS first."""
    rng = np.random.default_rng([PROBE_SEED, rows, length])
    ids = rng.integers(0, N_RANKS, size=(rows, length), dtype=np.int64)
    ids[:, 0] = int(check.raw()["bos_id"])
    return ids


def run_plan(
    check: Part3Base, model: str, ids: np.ndarray, mode: str, steps: list[list[int]]
) -> PlanRun:
    """``steps`` of ``ids`` on the student's model (with the cache unless ``mode`` is
    "no_cache"), recorded, against each reference: the one under which it goes right the
    longest (the student's RoPE convention)."""
    header = {"op": "stages", "model": model, "kv_caching": mode != "no_cache", "steps": steps}
    what = f"forward (isolation, {wording.plan_words(mode, steps)})"
    try:
        reply = check.call(header, {"tokens": ids}, what)
    except SubmissionError as exc:
        return PlanRun(mode, steps, raised=exc.signature or exc.message.splitlines()[0][:200])
    best: PlanRun | None = None
    got = reply.arrays.get("logits")
    for ref in references(check, model):
        want = ref.logits(ids)
        off = departure(got, want, check.atol())
        if off is None:
            return PlanRun(mode, steps)
        rows = tuple(
            r for r in range(len(ids)) if departure(row(got, r), want[r : r + 1], check.atol())
        )
        finding = first_departure(ref, reply.arrays, ids, 0.0)
        run = PlanRun(mode, steps, off[0], off[1], finding, rows=rows)
        if best is None or later(run, best):
            best = run
    return best or PlanRun(mode, steps)


def row(got: Any, r: int) -> Any:
    """Row ``r`` of a (B, T, vocab) reply, kept 3-D (None where there is none)."""
    return (
        got[r : r + 1] if isinstance(got, np.ndarray) and got.ndim == 3 and len(got) > r else None
    )


def later(run: PlanRun, than: PlanRun) -> bool:
    """Whether ``run`` goes right further than ``than`` (its first piece, then position)."""
    order = wording.PIECE_ORDER

    def key(r: PlanRun) -> tuple[int, int, int]:
        f = r.finding
        piece = (f.layer, order.index(f.piece)) if f else (10**6, 0)
        return (*piece, r.position or 0)

    return key(run) > key(than)


def batch1_plans(length: int) -> list[tuple[str, list[list[int]]]]:
    split = plans(length)
    return [
        ("no_cache", split["no_cache"]),
        ("one_call", split["no_cache"]),
        ("cached", split["cached"]),
        ("chunked", split["chunked"]),
    ]


def narrow_forward(check: Part3Base, model: str) -> tuple[list[Cause], list[str]]:
    """The causes and lines the experiments single out for ``model`` (once per grading and
    model); nothing when the reference cannot be trusted or nothing departs. Never raises."""
    memo = check.ctx.scratch.setdefault("part3.isolated_forward", {})
    if model not in memo:
        try:
            memo[model] = experiments(check, model)
        except Exception:  # an optional hint: the check's own message stands without it
            memo[model] = ([], [])
    return memo[model]


def experiments(check: Part3Base, model: str) -> tuple[list[Cause], list[str]]:
    if not references(check, model):
        return [], []
    ids = probe_ids(check, 1, PROBE_LEN)
    runs = [run_plan(check, model, ids, mode, steps) for mode, steps in batch1_plans(PROBE_LEN)]
    line = wording.plans_line(runs, PROBE_LEN)
    departed = [r for r in runs if r.position is not None]
    if departed:
        follow = follow_up(check, model, ids, departed[0])
        return [wording.plan_cause(runs, departed[0], follow)], [line]
    if any(r.raised for r in runs):
        return [], [line]
    return rows_and_length(check, model)


def follow_up(check: Part3Base, model: str, ids: np.ndarray, first: PlanRun) -> dict[str, Any]:
    """One more plan where the first departing plan leaves two places open:

    - chunks depart, one token per call is right: a prefill, one chunk, then one token per
      call. The attention of the single tokens after the chunk, recomputed on its own
      inputs, reads what the chunk left in its layer's cache: right there, the chunk's own
      tokens attend wrong (its mask); wrong, the chunk's keys and values were not kept.
    - decode steps after a prefill depart: one token per call from position 0, no prefill.
      Right there, what follows a call of several tokens departs; wrong, a decode call alone.
    """
    length = ids.shape[1]
    if first.mode == "chunked" and first.finding and first.finding.piece == "attention":
        k = first.steps[0][1]
        steps = [[0, k], [k, 4], *([t, 1] for t in range(k + 4, length))]
        layer = first.finding.layer
        after = attention_after(check, model, ids, steps, layer, k + 4)
        return {} if after is None else {"chunk_cache_right": after, "layer": layer}
    if first.mode == "cached":
        run = run_plan(check, model, ids, "cached", [[t, 1] for t in range(length)])
        return {} if run.raised else {"tokens_from_zero": run}
    return {}


def attention_after(
    check: Part3Base, model: str, ids: np.ndarray, steps: list[list[int]], layer: int, start: int
) -> bool | None:
    """Whether layer ``layer``'s attention of positions ``start`` on, in ``steps``, is
    right on its own inputs (under every reference convention that is right before)."""
    header = {"op": "stages", "model": model, "kv_caching": True, "steps": steps}
    try:
        reply = check.call(header, {"tokens": ids}, "forward (isolation, a chunk then tokens)")
    except SubmissionError:
        return None
    a_in, a_out = (
        reply.arrays.get(f"in.attention.{layer}"),
        reply.arrays.get(f"out.attention.{layer}"),
    )
    if a_in is None or a_out is None:
        return None
    verdicts = [
        departure(a_out[:, start:], ref.attention_on(layer, a_in)[:, start:], 0.0) is None
        for ref in references(check, model)
    ]
    return any(verdicts)


def rows_and_length(check: Part3Base, model: str) -> tuple[list[Cause], list[str]]:
    """Every plan right for one short prompt: three different prompts in one batch, each
    row against the same tokens alone; then one prompt of ``max_seq_len`` tokens."""
    batch = probe_ids(check, BATCH_ROWS, PROBE_LEN)
    for mode, steps in batch1_plans(PROBE_LEN)[::3]:  # without the cache, and in chunks
        together = run_plan(check, model, batch, mode, steps)
        if together.position is None:
            continue
        rows = list(together.rows)
        alone = [run_plan(check, model, batch[r : r + 1], mode, steps) for r in rows]
        if rows and all(a.right for a in alone):
            return [wording.batch_cause(together, rows, BATCH_ROWS, PROBE_LEN)], []
        return [], []
    n = int(check.raw()["max_seq_len"])
    long_ids = probe_ids(check, 1, n)
    for mode in ("no_cache", "cached"):
        run = run_plan(check, model, long_ids, mode, plans(n)[mode])
        if run.position is not None:
            return [wording.long_cause(run, PROBE_LEN, n)], []
    return [], []
