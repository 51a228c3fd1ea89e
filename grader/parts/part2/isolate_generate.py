"""generate's output against the reference's, token by token, after a check of generate
failed (its shape, its prompt, or its two modes disagreeing).

The grader picks a prompt of the public model whose greedy continuation the reference
(:mod:`reference_np`) wins clearly at every step, and asks generate for ``NEW`` tokens at
a temperature that makes any right sampler greedy, with the cache and without. Each
output, as returned, is laid against the prompt followed by the reference's tokens: one
token too many or too few at the end, the prompt overwritten (which positions), the
output shifted by a token, or the first new token that departs in one mode only. Nothing
is said of an output that fits none of these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.parts.part2.cases import top2_gap
from grader.parts.part2.isolate_forward import reference
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part2.support import Part2Base

PROMPT, NEW, TEMPERATURE, SEED, MIN_GAP = 6, 6, 1e-5, 8282, 0.05


def greedy_prompt(check: Part2Base) -> tuple[np.ndarray, np.ndarray] | None:
    """A seeded prompt (1, PROMPT) and the reference's greedy continuation (1, PROMPT +
    NEW), every step won by at least ``MIN_GAP``; None when no candidate does."""
    ref = reference(check, "public")
    if ref is None:
        return None
    vocab = check.model_spec("public")["config"]["vocab_size"]
    rng = np.random.default_rng(SEED)
    for _ in range(20):
        tokens = rng.integers(0, vocab, size=(1, PROMPT), dtype=np.int64)
        prompt, clear = tokens.copy(), True
        for _ in range(NEW):
            logits = ref.logits(tokens)[:, -1:, :]
            clear = clear and top2_gap(logits) >= MIN_GAP
            tokens = np.concatenate([tokens, logits.argmax(-1)], axis=1)
        if clear:
            return prompt, tokens
    return None


def raw_generate(check: Part2Base, prompt: np.ndarray, use_cache: bool) -> Any:
    header = {
        "op": "generate",
        "model": "public",
        "max_new_tokens": NEW,
        "temperature": TEMPERATURE,
        "use_cache": use_cache,
        "seed": SEED,
    }
    what = f"generate (isolation, {NEW} tokens, use_cache={use_cache})"
    try:
        return check.call(header, {"input_ids": prompt}, what).arrays.get("tokens")
    except SubmissionError:
        return None


def compare(got: Any, want: np.ndarray) -> tuple[str, str] | None:
    """(id, finding) of one output against the prompt and the reference's tokens ``want``
    (1, PROMPT + NEW); None when it is right or fits no pattern."""
    if not isinstance(got, np.ndarray) or got.ndim != 2 or got.shape[0] != 1:
        return None
    n, full, new = got.shape[1], want.shape[1], want[:, PROMPT:]
    if n in (full, NEW) and (np.array_equal(got, want) or np.array_equal(got, new)):
        return None
    for expected, form in ((want, "the prompt and the new tokens"), (new, "the new tokens")):
        if n == expected.shape[1] + 1 and np.array_equal(got[:, :-1], expected):
            return "isolated:generate_extra_token", (
                f"it returned {form} followed by one token more ({n} tokens where "
                f"{expected.shape[1]} belong): the reference's {NEW} new tokens are all "
                "there, then an extra one"
            )
        if n == expected.shape[1] - 1 and np.array_equal(got, expected[:, :-1]):
            return "isolated:generate_one_short", (
                f"it returned {form} without the last new token ({n} tokens where "
                f"{expected.shape[1]} belong): one step fewer than max_new_tokens"
            )
    if n == full and np.array_equal(got[:, PROMPT:], new):
        where = [int(i) for i in np.flatnonzero(got[0, :PROMPT] != want[0, :PROMPT])]
        return "isolated:generate_prompt_overwritten", (
            f"its {NEW} new tokens are the reference's, but the prompt in front of them is "
            f"changed at positions {', '.join(str(i + 1) for i in where)} of {PROMPT}"
        )
    if n == full and np.array_equal(got[:, :-1], want[:, 1:]):
        return "isolated:generate_output_shifted", (
            "it returned the sequence shifted by one token: the prompt's first token is "
            "missing and one new token more is at the end"
        )
    if n == full and np.array_equal(got[:, :PROMPT], want[:, :PROMPT]):
        k = int(np.flatnonzero(got[0, PROMPT:] != new[0])[0])
        right = "" if not k else f" and its first {k} new token(s) are the reference's"
        return f"isolated:generate_departs_at_step_{k + 1}", (
            f"the prompt is kept{right}, but new token {k + 1} of {NEW} departs"
        )
    return None


def narrow_generate(check: Part2Base) -> tuple[list[Cause], list[str]]:
    """The causes and lines of the comparison above, once per grading; never raises."""
    memo = check.ctx.scratch.setdefault("part2.isolated_generate", [])
    if not memo:
        try:
            memo.append(experiment(check))
        except Exception:  # an optional hint
            memo.append(([], []))
    return memo[0]


SENTENCES = {
    "isolated:generate_extra_token": "your generate returns one token more than "
    "max_new_tokens: it makes max_new_tokens + 1 steps, or appends the last sampled token "
    "twice",
    "isolated:generate_one_short": "your generate makes one step fewer than max_new_tokens",
    "isolated:generate_prompt_overwritten": "your generate changes the prompt in its "
    "output (it writes into input_ids, or into a buffer whose first positions are not the "
    "prompt); the output must begin with input_ids unchanged",
    "isolated:generate_output_shifted": "your generate returns the sequence shifted by one "
    "token (the first prompt token dropped)",
}


def step_cause(cached: bool, step: int, evidence: str) -> Cause:
    """One mode's new token ``step`` (from 1) departs, the other mode is right."""
    which, other = ("with", "without") if cached else ("without", "with")
    where = "the prefill" if step == 1 else f"decode step {step - 1} after the prefill"
    if not cached:
        where = f"the step that makes new token {step}"
    return Cause(
        f"isolated:generate_{'cached' if cached else 'uncached'}_step_departs",
        f"your generate {which} the cache departs from the reference's greedy tokens first "
        f"at new token {step}, while generate {other} the cache is right: look at what "
        f"{where} feeds forward and what it gets back",
        evidence,
    )


def experiment(check: Part2Base) -> tuple[list[Cause], list[str]]:
    chosen = greedy_prompt(check)
    if chosen is None:
        return [], []
    prompt, want = chosen
    found = {}
    for use_cache in (True, False):
        result = compare(raw_generate(check, prompt, use_cache), want)
        if result is not None:
            found[use_cache] = result
    if not found:
        return [], []
    lead = (
        f"generate on a prompt of {PROMPT} tokens the grader chose, {NEW} new tokens at "
        f"temperature {TEMPERATURE:g} (greedy for any right sampler), against the prompt "
        "and the reference's greedy tokens"
    )
    said = "; ".join(f"with use_cache={mode}: {text}" for mode, (_, text) in found.items()) + (
        "" if len(found) == 2 else f"; with use_cache={not next(iter(found))}: right"
    )
    evidence = f"{lead}: {said}"
    causes = []
    for mode, (cause_id, _) in found.items():
        if cause_id in SENTENCES:
            causes.append(Cause(cause_id, SENTENCES[cause_id], evidence))
        elif len(found) == 1:
            causes.append(step_cause(mode, int(cause_id.rsplit("_", 1)[1]), evidence))
    unique = list({c.id: c for c in causes}.values())
    return unique, [f"Narrowed by experiment: {evidence}."]
