"""Part 3 and the course's own Llama code: which RoPE convention a submission follows, how
its model was built, and the mistakes of the course's template that feedback must name.

The course hands its students Meta's layout without ``Llama.build``, with plain RoPE
(no Llama 3.2 frequency scaling), a cache allocated with ``.cuda()`` and the mode fixed
when the model is built. The grader accepts all of that (the worker builds the model
the course's way and sends ``.cuda()`` to the grading device); what it cannot accept,
it names here. Pure functions of the case data and of what the worker reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.core.arrays import decode_array
from grader.judging.logits import compare
from grader.parts.part3.isolate import kept_stop_causes, ran_past_stop

#: The RoPE conventions the case files hold expected values for.
SCALED, UNSCALED = "scaled", "unscaled"
#: Where the unscaled values sit in the public and in the hidden file.
UNSCALED_KEYS = ("unscaled_rope", "unscaled_rope_hidden")
EOT = "<|eot_id|>"
#: What a submission with plain RoPE is told (checks 3.1 and 3.2).
UNSCALED_NOTE = (
    "Your RoPE has no Llama 3.2 frequency scaling (the course's convention): your logits "
    "and texts are compared with a reference that uses the same RoPE."
)


def rope_view(data: dict[str, Any], rope: str) -> dict[str, Any]:
    """The case data as a submission of RoPE convention ``rope`` is judged by."""
    if rope != UNSCALED:
        return data
    view = dict(data)
    for key in UNSCALED_KEYS:
        view.update(data.get(key, {}))
    return view


def expected_logits(case: dict[str, Any], rope: str) -> np.ndarray:
    """A forward case's expected logits under RoPE convention ``rope``."""
    key = "expected_unscaled" if rope == UNSCALED and "expected_unscaled" in case else "expected"
    return decode_array(case[key])


def rope_convention(got: Any, case: dict[str, Any], atol: float) -> str | None:
    """The convention whose reference logits ``got`` (a cache-free forward of ``case``)
    matches, or None when it matches neither."""
    if not isinstance(got, np.ndarray) or got.shape[:2] != np.shape(case["tokens"]):
        return None
    positions = case["positions"]
    for rope in (SCALED, UNSCALED):
        if compare(got[:, positions, :], expected_logits(case, rope), atol).ok:
            return rope
    return None


def build_notes(notes: dict[str, Any], rope: str, device: str) -> list[str]:
    """What the student should know about how the grader built and judged their model."""
    lines = []
    if notes.get("built_by") == "constructor":
        lines.append(
            "Your Llama has no build(): it was built as the course's scripts do, "
            "Llama(ModelArgs(**params.json)) and load_state_dict(strict=True)."
        )
    if notes.get("dropped_fields"):
        lines.append(
            f"params.json fields your ModelArgs lacks were left out: {notes['dropped_fields']}."
        )
    if notes.get("cuda_calls"):
        lines.append(
            f"This grader has no GPU: your code's .cuda() calls ({notes['cuda_calls']}) placed "
            f"their tensors on {device} instead (on a GPU the same code runs unchanged)."
        )
    if rope == UNSCALED:
        lines.append(UNSCALED_NOTE)
    if notes and notes.get("switch") is False:
        lines.append(
            "Your Llama fixes kv_caching when it is built (no set_kv_caching), as the course's "
            "code does: every check builds one model per mode."
        )
    return lines


def generation_causes(
    header: dict[str, Any], got: list[str], want: list[str], meta: dict[str, Any], max_seq_len: int
) -> dict[str, str]:
    """The course template's mistakes that explain a generate whose texts ``got`` differ
    from the reference's ``want``, as the worker saw them (its first token ids and the
    positions of its forward calls): no BOS, a left-padded batch, positions past
    ``max_seq_len``, no stop at ``<|eot_id|>``. Each is named only where the evidence
    shows it: id -> text."""
    causes = first_token_causes(header.get("first_ids") or [], meta.get("bos_id"))
    calls = header.get("calls") or []
    reached = max((int(s) + int(n) for s, n in calls), default=0)
    if reached > max_seq_len:
        causes["past_max_seq_len"] = (
            f"generate fed the model positions up to {reached}, past max_seq_len = "
            f"{max_seq_len}: total_len must be min(max_seq_len, max_prompt_len + max_gen_len) "
            "(the model holds max_seq_len positions: a cache drops the writes past them)."
        )
    # The text against the reference's: the stop token kept at the end is not a run-on.
    ran_on = ran_past_stop(got, want, EOT)
    causes.update(kept_stop_causes(got, want, EOT))
    if ran_on:
        causes["no_eot_stop"] = (
            f"generate did not stop at {EOT} (prompt(s) {ran_on} went on after it): Llama 3 "
            "ends a turn with it. Stop at every token of tokenizer.stop_tokens "
            "(<|end_of_text|> and <|eot_id|>), not only at tokenizer.eos_id, and cut the text "
            "there."
        )
    return causes


def first_token_causes(first: list[Any], bos: int | None) -> dict[str, str]:
    """What the first token of each row that generate fed the model shows: no BOS in any
    row, or BOS in some rows and one other id in the rest, the pad of a left-padded batch
    (the shorter prompts pushed right, behind pad tokens they attend to, at other
    positions); nothing where neither explains the ids."""
    if bos is None or not first or all(t == bos for t in first):
        return {}
    if bos not in first:
        return {
            "bos_missing": (
                f"the prompts were encoded without BOS: the first token your generate fed "
                f"the model is {first[0]}, not <|begin_of_text|> ({bos}). Llama 3 expects it "
                "first: tokenizer.encode(prompt, bos=True, eos=False)."
            )
        }
    pads = {t for t in first if t != bos}
    if len(pads) != 1:
        return {}
    rows = [i + 1 for i, t in enumerate(first) if t != bos]
    return {
        "left_padded": (
            f"the batch was left-padded: generate fed the model {pads.pop()} as the first "
            f"token of row(s) {rows} and <|begin_of_text|> ({bos}) in the others, so the "
            "shorter prompts sit behind pad tokens, which they attend to, at positions "
            "other than their own. Meta's generate right-pads: tokens[k, : len(t)] = t, "
            "decoding from min_prompt_len and keeping each prompt's own tokens "
            "(input_text_mask)."
        )
    }
