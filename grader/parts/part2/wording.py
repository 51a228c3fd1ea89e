"""The words of Part 2's isolated causes: each finding of an experiment as a cause (an
``isolated:`` id, the sentence a student reads, the evidence that singled it out) and the
line that says which plans were right.

Every sentence states what the experiment showed, in the place it showed it (the call,
the layer, the piece, the positions); none guesses the line of code beyond what the
evidence fixes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from grader.core.feedback_items import Cause

if TYPE_CHECKING:
    from grader.parts.part2.pieces import Finding, PlanResult

NARROWED = "Narrowed by experiment:"

#: The ids of the causes below, by the piece or experiment that found them.
IDS = {
    "positions": "isolated:call_positions_wrong",
    "embedding": "isolated:embedding_departs",
    "attention_input": "isolated:attention_input_not_norm1",
    "new_only": "isolated:attention_ignores_cache",
    "not_itself": "isolated:attention_skips_own_token",
    "unmasked": "isolated:attention_sees_later_tokens",
    "cache": "isolated:cache_contents_wrong",
    "scale": "isolated:attention_scale_wrong",
    "attention": "isolated:attention_departs",
    "cached_attention": "isolated:cached_attention_departs",
    "feed_forward": "isolated:feed_forward_departs",
    "layer": "isolated:layer_wiring_departs",
    "between_layers": "isolated:layers_not_chained",
    "head": "isolated:output_head_departs",
    "long": "isolated:long_sequences_depart",
}


def call_words(call: int, steps: list[int]) -> str:
    """ "call 2 (3 new tokens after 4 cached)" for the 0-based ``call`` of ``steps``."""
    before = sum(steps[:call])
    n = steps[call]
    new = f"{n} new token{'s' if n > 1 else ''}"
    if len(steps) == 1:
        return "its one call"
    return f"call {call + 1} of {len(steps)} ({new} after {before} cached)"


#: How the line of the first departing piece begins.
PIECE = "The first piece that departs, each recomputed on the input it was given:"


def plans_line(results: list[PlanResult], length: int, model: str) -> str:
    """Which plans were right on the grader's prompt, and where the others departed."""
    parts = []
    for r in results:
        if r.right:
            parts.append(f"{r.label}: right")
        elif r.raised:
            parts.append(f"{r.label}: raised {r.raised}")
        else:
            where = f"position {(r.pos or 0) + 1}"
            if r.steps is not None and len(r.steps) > 1:
                where = f"{call_words(r.call or 0, r.steps)}, {where}"
            parts.append(f"{r.label}: first departs at {where} (off by up to {r.error:.3g})")
    return (
        f"{NARROWED} on a prompt of {length} tokens the grader chose ({model} model, batch "
        f"1), against the reference's logits: " + "; ".join(parts) + "."
    )


def finding_cause(found: Finding, label: str, steps: list[int], later_call: bool) -> Cause:
    """The cause of the first piece that departs, run ``label`` (the plan ``steps``);
    ``later_call``: earlier calls of the plan were right."""
    where = call_words(found.call, steps)
    layer = f"layer {found.layer}"
    facts = found.facts
    run = f"{label}, {where}"
    if found.piece == "embedding":
        start = facts["start"]
        if "embedded_at" in facts:
            at, n = facts["embedded_at"], facts["tokens"]
            width = ", the model's d_model" if at == facts.get("width") else ""
            return Cause(
                IDS["positions"],
                f"your forward embeds the new tokens of a cached call at positions from {at}"
                f"{width}, where they follow {plural(start, 'cached token')} (positions from "
                f"{start}): the positions of a cached call continue after the tokens already "
                "in the cache (their number is the cache's sequence length, dim 1)",
                f"{run}, layer 0's input is token_embedding + pos_embedding at "
                f"{span(at, n)}, not at {span(start, n)}",
            )
        return Cause(
            IDS["embedding"],
            "your forward's first layer is given something other than token_embedding(ids) "
            "+ pos_embedding(positions)",
            f"{run}, layer 0's input departs from the embedding of its tokens by up to "
            f"{found.error:.3g}",
        )
    if found.piece == "attention_input":
        given = facts.get("given", "something else")
        return Cause(
            IDS["attention_input"],
            f"your {layer}'s attention is given {given}, not norm1 of it (the handout's "
            "layers are pre-LN: x + attention(norm1(x)))",
            f"{run}, {layer}'s attention input departs from norm1 of the layer's input by up "
            f"to {found.error:.3g}",
        )
    if found.piece == "attention":
        return attention_cause(found, run, later_call)
    if found.piece == "cache":
        past = facts["past"]
        return Cause(
            IDS["cache"],
            cache_sentence(found.layer, facts["cache"], past),
            f"{label}, {call_words(found.call, steps)} departs, and the cache the call before "
            f"handed it does not hold the keys and values of the {plural(past, 'token')} "
            "seen (computed from the inputs its attention was given)",
        )
    return block_cause(found, run)


def attention_cause(found: Finding, run: str, later_call: bool) -> Cause:
    layer, facts = f"layer {found.layer}", found.facts
    past = facts.get("past", 0)
    measured = (
        f"{run}, {layer}'s attention departs by up to {found.error:.3g} from attention over "
        f"the keys and values of the tokens it was given"
    )
    view = facts.get("view")
    if view == "new_only":
        return Cause(
            IDS["new_only"],
            f"in a cached call your {layer}'s attention attends only to the new tokens: the "
            f"{past} cached keys and values are not read (concatenate them in front of the "
            "new ones, on the sequence dimension)",
            f"{measured}, and matches attention over the new tokens alone",
        )
    if view == "not_itself":
        return Cause(
            IDS["not_itself"],
            f"your {layer}'s attention lets a token attend to the tokens before it but not "
            "to itself (its own key and value must be among those it attends to)",
            f"{measured}, and matches attention over the earlier tokens only",
        )
    if view == "unmasked":
        return Cause(
            IDS["unmasked"],
            f"your {layer}'s attention lets each token of a call attend to the later tokens "
            "of the same call: no causal mask is applied there",
            f"{measured}, and matches attention with no mask",
        )
    if "scale" in facts:
        return Cause(
            IDS["scale"],
            f"your {layer}'s attention divides the scores by {divisor(facts['scale'])}, not "
            f"by sqrt(d_model) = {np.sqrt(facts['d_model']):.4g} (this model's d_model is "
            f"{facts['d_model']})",
            f"{measured}, and matches the same attention with the scores divided by "
            f"{facts['scale']:.4g}",
        )
    if past and later_call:
        return Cause(
            IDS["cached_attention"],
            f"your {layer}'s attention is right in a call with nothing cached but wrong "
            f"after {past} cached tokens, though the cache it was handed holds the right keys "
            "and values: look at how a cached call joins them with the new ones and masks "
            "them (T_new queries against T_total keys)",
            measured,
        )
    return Cause(
        IDS["attention"],
        f"your {layer}'s attention departs from softmax(q kᵀ / sqrt(d_model)) v, then W_o, "
        "on the very input it was given (its norms, residuals and feed-forward block are "
        "not involved)",
        measured,
    )


def cache_sentence(layer: int, facts: dict[str, Any], past: int) -> str:
    """What the cache layer ``layer`` handed back holds, against the keys and values of
    the ``past`` tokens it had seen."""
    said = []
    for name in ("keys", "values"):
        if name not in facts:
            continue
        fact = facts[name]
        if fact.get("shape") != fact.get("want"):
            shape = "nothing" if fact.get("shape") is None else f"shape {tuple(fact['shape'])}"
            said.append(f"its {name} are {shape} where {tuple(fact['want'])} belong")
        elif "holds" in fact:
            said.append(f"its {name} hold {fact['holds']}")
        else:
            said.append(f"its {name} are wrong at positions {shown(fact.get('positions', []))}")
        slots = fact.get("slots")
        if slots and any(s >= 0 for s in slots):
            said[-1] += f" (its slots hold the {name} of positions {shown(slots)})"
    return (
        f"the cache your layer {layer} hands back after {plural(past, 'token')} does not hold "
        "their keys "
        f"and values, each (B, {past}, d_model): " + "; ".join(said)
    )


def divisor(scale: float) -> str:
    """A divisor as found, and as the square root or the whole number it is, if either."""
    if round(scale) and abs(scale / round(scale) - 1) < 1e-3:
        return f"{round(scale)}"
    square = round(scale * scale)
    if square and abs(scale * scale / square - 1) < 2e-3:
        return f"{scale:.4g} = sqrt({square})"
    return f"{scale:.4g}"


def plural(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def span(start: int, n: int) -> str:
    return f"position {start}" if n == 1 else f"positions {start} to {start + n - 1}"


def shown(numbers: list[int], most: int = 8) -> str:
    text = ", ".join("none" if n < 0 else str(n) for n in numbers[:most])
    return text + (", ..." if len(numbers) > most else "")


def block_cause(found: Finding, run: str) -> Cause:
    layer = f"layer {found.layer}"
    if found.piece == "feed_forward":
        return Cause(
            IDS["feed_forward"],
            f"your {layer}'s feed-forward block departs from fc2(relu(fc1(x))) on the very "
            "input it was given",
            f"{run}, {layer}'s feed-forward output departs by up to {found.error:.3g}",
        )
    if found.piece == "layer":
        return Cause(
            IDS["layer"],
            f"your {layer}'s attention and feed-forward block are right on their own inputs, "
            "but the layer's output is not x + attention(norm1(x)), then + "
            "feed_forward(norm2(·)) of that: the norms, residual additions or dropout around "
            "them are wired otherwise",
            f"{run}, {layer}'s output departs by up to {found.error:.3g} from the pre-LN "
            "sum of its own pieces' outputs",
        )
    if found.piece == "between_layers":
        return Cause(
            IDS["between_layers"],
            f"your {layer} is not given the output of layer {found.layer - 1}",
            f"{run}, {layer}'s input departs from layer {found.layer - 1}'s output by up to "
            f"{found.error:.3g}",
        )
    return Cause(
        IDS["head"],
        "every layer of your model is right, but the logits are not "
        "output_projection(norm(x)) of the last layer's output",
        f"{run}, the logits depart by up to {found.error:.3g} from the final norm and output "
        "projection of the last layer's output",
    )


def long_cause(result: PlanResult, short: int, n: int) -> Cause:
    """Right on a short prompt, wrong on one of ``n`` (max_seq_len) tokens."""
    return Cause(
        IDS["long"],
        f"your forward is right on a short prompt but not on a long one: look at what is "
        f"sized by a fixed number rather than by the sequence or max_seq_len ({n})",
        f"every plan is right on {short} tokens, but on {n} tokens {result.label} first "
        f"departs at position {(result.pos or 0) + 1} (off by up to {result.error:.3g})",
    )
