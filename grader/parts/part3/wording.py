"""The words of Part 3's isolated forward causes: each finding of :mod:`.isolate_forward` as
a cause (an ``isolated:`` id, the sentence a student reads, the evidence that singled it
out) and the line that says which plans were right.

Every sentence states what an experiment showed, in the place it showed it (the plan, the
call, the layer, the piece, the position); none guesses the line of code beyond what the
evidence fixes, and where the evidence leaves two places open it names both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grader.core.feedback_items import Cause

if TYPE_CHECKING:
    from grader.parts.part3.pieces import Finding, PlanRun

NARROWED = "Narrowed by experiment:"

#: The pieces of one layer in the order they run (:mod:`.pieces`).
PIECE_ORDER = [
    "embeddings", "attention_input", "attention", "ffn_input", "feed_forward", "layer", "logits",
]  # fmt: skip

#: The ids of the causes, by the plan or experiment that found them.
IDS = {
    "no_cache": "isolated:forward_departs_without_cache",
    "one_call": "isolated:cached_call_departs",
    "cached": "isolated:decode_steps_depart",
    "chunked": "isolated:chunks_depart",
    "chunk_mask": "isolated:chunk_mask_wrong",
    "chunk_cache": "isolated:chunk_not_kept_in_cache",
    "batch": "isolated:batch_rows_differ",
    "long": "isolated:long_sequences_depart",
}


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plan_words(mode: str, steps: list[list[int]]) -> str:
    first = steps[0][1]
    return {
        "no_cache": "kv_caching off, the whole prompt in one call",
        "one_call": "kv_caching on, the whole prompt in one call",
        "cached": f"kv_caching on, a prefill of {first} then one token per call",
        "chunked": f"kv_caching on, a prefill of {first} then chunks of up to 4",
    }[mode]


def piece_words(f: Finding) -> str:
    i = f.layer
    return {
        "embeddings": "the token embeddings (tok_embeddings)",
        "attention_input": f"the input of layer {i}'s attention, which must be attention_norm "
        "of the layer's input",
        "attention": f"layer {i}'s attention (layers[{i}].attention)",
        "ffn_input": f"the input of layer {i}'s feed-forward, which must be ffn_norm of the "
        "layer's input plus its attention's output",
        "feed_forward": f"layer {i}'s feed-forward (layers[{i}].feed_forward)",
        "layer": f"layer {i}'s output, which must be its input plus its attention's and its "
        "feed-forward's outputs (the residual sums)",
        "logits": "the logits of the last layer's output (the final norm, then output)",
    }[f.piece]


def where(run: PlanRun) -> str:
    """The first departing position of ``run`` and the call it belongs to."""
    pos, call = run.position or 0, run.call
    start, n = run.steps[call]
    if len(run.steps) == 1:
        return f"position {pos}"
    token = f"token {pos - start + 1} of {n} of " if n > 1 else ""
    if run.steps[0][1] == 1:  # no prefill: one token per call from position 0
        return f"position {pos}, {token}call {call + 1} (start_pos {start})"
    if call == 0:
        return f"position {pos}, in the prefill (its first call, positions 0 to {n - 1})"
    return f"position {pos}, {token}the {ordinal(call)} call after the prefill (start_pos {start})"


def run_words(run: PlanRun) -> str:
    if run.raised:
        return f"raised {run.raised}"
    if run.right:
        return "right"
    return f"departs from {where(run)}, by up to {run.error:.3g}"


def plans_line(runs: list[PlanRun], length: int) -> str:
    """Which plans were right on the grader's prompt, and where the others departed."""
    said = "; ".join(f"{plan_words(r.mode, r.steps)}: {run_words(r)}" for r in runs)
    return f"{NARROWED} on {length} tokens the grader chose (batch 1), {said}."


def piece_sentence(run: PlanRun) -> str:
    """What the recorded pieces show, "" where none departs on its own input."""
    f = run.finding
    if f is None:
        return ""
    return (
        f"; of its pieces, each recomputed by the grader on the input your model gave it, "
        f"the first that departs is {piece_words(f)}, from position {f.position} (off by up "
        f"to {f.error:.3g})"
    )


def plan_cause(runs: list[PlanRun], first: PlanRun, follow: dict[str, Any]) -> Cause:
    """The cause of the first plan that departs, given which plans before it are right and
    what the follow-up plan showed (``isolate_forward.follow_up``)."""
    evidence = "; ".join(f"{plan_words(r.mode, r.steps)}: {run_words(r)}" for r in runs)
    if first.mode == "chunked" and "chunk_cache_right" in follow:
        return chunk_cause(first, follow, evidence)
    if first.mode == "cached" and "tokens_from_zero" in follow:
        alone: PlanRun = follow["tokens_from_zero"]
        evidence += f"; one token per call from position 0: {run_words(alone)}"
    return Cause(IDS[first.mode], plan_text(runs, first, follow), evidence)


def plan_text(runs: list[PlanRun], first: PlanRun, follow: dict[str, Any]) -> str:
    by_mode = {r.mode: r for r in runs}
    pieces = piece_sentence(first)
    if first.mode == "no_cache":
        text = f"your forward goes wrong without the cache too, from {where(first)}{pieces}"
    elif first.mode == "one_call":
        text = (
            "your forward with kv_caching=True gives the whole prompt in one call at "
            "start_pos 0 other logits than without the cache (which are right), from "
            f"{where(first)}{pieces}: the cached path of a single call departs"
        )
    elif first.mode == "cached":
        call = first.call
        steps = (
            "the prefill is right and the first decode step departs"
            if call == 1
            else f"the prefill and the first {call - 1} decode steps are right and the "
            f"{ordinal(call)} departs (look at what the steps before it wrote to the cache)"
        )
        if call == 0:
            steps = "the prefill already departs, though the same prompt in one call is right"
        chunks = by_mode.get("chunked")
        also = "" if chunks is None or chunks.right else "; chunks depart too"
        text = (
            "your forward is right for the whole prompt in one call, with and without the "
            f"cache, but not one token per call after a prefill: {steps}, at "
            f"{where(first)}{pieces}{also}"
        )
        alone = follow.get("tokens_from_zero")
        if alone is not None and alone.right:
            text += (
                "; one token per call from position 0 is right, so what departs follows a "
                "call of several tokens: what it left in the cache, or the position counted "
                "after it"
            )
        elif alone is not None:
            text += (
                f"; one token per call from position 0 departs too (from {where(alone)}): "
                "the decode call itself (the cache it reads, the position it is at)"
            )
    else:
        text = (
            "your forward is right one token per call and for the whole prompt at once, but "
            f"a chunk of several tokens at start_pos > 0 departs, at {where(first)}{pieces}: "
            "what differs for such a call is its causal mask (token i of the chunk sees "
            "positions 0 .. start_pos + i) and the several positions it writes to the cache "
            "and reads back at once"
        )
    return text


def chunk_cause(first: PlanRun, follow: dict[str, Any], evidence: str) -> Cause:
    """A chunk departs: whether the cache it left is right decides between its mask and
    what it writes (``isolate_forward.follow_up``)."""
    layer, right = follow["layer"], follow["chunk_cache_right"]
    lead = (
        "your forward is right one token per call and for the whole prompt at once, but a "
        f"chunk of several tokens at start_pos > 0 departs, at {where(first)}"
        f"{piece_sentence(first)}"
    )
    after = (
        f"a prefill, one chunk, then one token per call: layer {layer}'s attention of the "
        f"single tokens after the chunk, which reads what the chunk left in its cache, is "
        f"{'right' if right else 'wrong'} on its own inputs"
    )
    if right:
        text = (
            f"{lead}; the one-token calls after such a chunk are right in layer {layer}'s "
            "attention, so the cache holds the chunk's keys and values: the chunk's own "
            "tokens attend wrong, through its causal mask. Token i of a chunk at start_pos "
            "sees positions 0 .. start_pos + i: a (T, start_pos + T) mask, zeros for the "
            "cached prefix, then the causal (T, T) block"
        )
        return Cause(IDS["chunk_mask"], text, f"{evidence}; {after}")
    text = (
        f"{lead}; the one-token calls after such a chunk depart too in layer {layer}'s "
        "attention, which reads what the chunk left in the cache: the keys and values of a "
        "call of several tokens at start_pos > 0 are not kept at its positions "
        "[start_pos : start_pos + seqlen] of the cache"
    )
    return Cause(IDS["chunk_cache"], text, f"{evidence}; {after}")


def batch_cause(together: PlanRun, rows: list[int], n: int, length: int) -> Cause:
    plan = plan_words(together.mode, together.steps)
    evidence = (
        f"{n} different prompts of {length} tokens in one batch ({plan}): row(s) "
        f"{[r + 1 for r in rows]} depart from the reference's logits, by up to "
        f"{together.error:.3g}, and each of them alone is right"
    )
    return Cause(
        IDS["batch"],
        "your forward gives a row of a batch other logits than the same tokens alone "
        f"(row {rows[0] + 1} of {n}, {plan}){piece_sentence(together)}: every row must be "
        "computed as if it were alone (look at what mixes the batch dimension with another: "
        "a view, reshape or transpose, or the cache's rows)",
        evidence,
    )


def long_cause(run: PlanRun, short: int, n: int) -> Cause:
    plan = plan_words(run.mode, run.steps)
    return Cause(
        IDS["long"],
        f"your forward is right for prompts of {short} tokens, in one batch or alone, but "
        f"departs on one of max_seq_len = {n} tokens ({plan}) from {where(run)}"
        f"{piece_sentence(run)}: look at what depends on the length (the RoPE table, the "
        "cache's positions)",
        f"a prompt of {n} tokens, {plan}: {run_words(run)}",
    )
