"""Part 3's isolating experiments: which of the mistakes that look alike the evidence shows.

Run only when a check already failed, on what the worker recorded for it:

- **3.7, the forward calls of a cached generate.** The whole prefix from position 0 at every
  step (calls of growing length, all at ``start_pos`` 0) is what a generate does that never
  advances ``prev_pos`` (``tokens[:, prev_pos:cur_pos]`` is then the prefix) and what one
  does that ignores ``kv_caching`` and always takes the cache-free call: the calls cannot
  tell them apart, so both are named, with the fact that would. One token per step at a
  ``start_pos`` that never moves is ``prev_pos`` not advanced alone.
- **3.5 and 3.9, the greedy text of a prompt whose continuation reaches ``<|eot_id|>``.**
  The reference's text followed by the stop token and nothing more is a generate that
  stopped there but kept the token; text going on after it is one that did not stop.
"""

from __future__ import annotations

from typing import Any

from grader.core.feedback_items import Cause

#: Every cached step fed the whole prefix from 0: kv_caching ignored (or prev_pos stuck).
KV_CACHING_IGNORED = "isolated:kv_caching_ignored"
#: The mutant library's name for prev_pos left at 0 (the other candidate of the same calls).
PREV_POS_NOT_ADVANCED = "prev_pos_not_advanced"
#: One token per cached step at a start_pos that never moves.
START_POS_STUCK = "isolated:start_pos_not_advanced"
#: Stopped at <|eot_id|> but kept it at the end of the text.
STOP_TOKEN_KEPT = "isolated:stop_token_kept"
#: How many recorded calls the evidence quotes.
QUOTED_CALLS = 4


def quoted(calls: list[Any]) -> str:
    """The first calls as (start_pos, length) pairs, "..." where more were made."""
    shown = ", ".join(f"({int(s)}, {int(n)})" for s, n in calls[:QUOTED_CALLS])
    return shown + (", ..." if len(calls) > QUOTED_CALLS else "")


def prefix_every_step(calls: list[Any]) -> bool:
    """Two calls or more, all at start_pos 0, each one token longer than the one before."""
    return len(calls) >= 2 and all(
        int(s) == 0 and (i == 0 or int(n) == int(calls[i - 1][1]) + 1)
        for i, (s, n) in enumerate(calls)
    )


def start_pos_stuck(calls: list[Any]) -> bool:
    """After the prefill, two steps or more of one token each, all at the same start_pos."""
    steps = calls[1:]
    return (
        len(steps) >= 2
        and all(int(n) == 1 for _, n in steps)
        and (len({int(s) for s, _ in steps}) == 1)
    )


def call_causes(
    cached: list[Any], plain: list[Any], diagnoses: dict[str, str]
) -> tuple[list[Cause], str]:
    """The causes a cached generate's recorded ``cached`` calls single out (``plain``: the
    cache-free generate's), and the line of evidence the message adds ("" and no cause
    where the pattern is neither of the two above)."""
    pairs = quoted(cached)
    if prefix_every_step(cached):
        same = " the same calls as with kv_caching=False," if cached == plain else ""
        line = (
            f"With kv_caching=True the calls, as (start_pos, length), were {pairs}: the whole "
            f"prefix from position 0 at every step,{same} never one new token at prev_pos. "
            "Two mistakes make exactly these calls: the cached call is never taken "
            "(kv_caching ignored), or prev_pos is never advanced (tokens[:, prev_pos:cur_pos] "
            "is then the whole prefix). With the cache a step feeds tokens[:, prev_pos:cur_pos] "
            "at start_pos = prev_pos, and prev_pos = cur_pos follows every step."
        )
        evidence = f"the cached generate's calls {pairs}"
        causes = [
            Cause(
                KV_CACHING_IGNORED,
                "your code ignores kv_caching: with the cache on it still feeds the whole "
                "prefix tokens[:, :cur_pos] at start_pos 0, the cache-free call",
                evidence,
            )
        ]
        if PREV_POS_NOT_ADVANCED in diagnoses:
            text = f"your code {diagnoses[PREV_POS_NOT_ADVANCED]}"
            causes.append(Cause(PREV_POS_NOT_ADVANCED, text, evidence))
        return causes, line
    if start_pos_stuck(cached):
        where = int(cached[1][0])
        line = (
            f"With kv_caching=True the calls, as (start_pos, length), were {pairs}: one new "
            f"token per step, but always at start_pos={where}."
        )
        cause = Cause(
            START_POS_STUCK,
            f"your code never advances prev_pos: every decode step passes start_pos={where}, "
            "so each new token takes the same position and overwrites the same cache slot; "
            "write prev_pos = cur_pos after every step",
            f"the cached generate's calls {pairs}",
        )
        return [cause], line
    return [], ""


def ran_past_stop(got: list[Any], want: list[str], stop: str) -> list[int]:
    """The prompts (counted from 1) whose text goes on after the reference's text and
    ``stop``: the generate did not stop there."""
    return [
        i + 1
        for i, (g, w) in enumerate(zip(got, want, strict=False))
        if isinstance(g, str) and g != w and g.startswith(w + stop) and g != w + stop
    ]


def kept_stop(got: list[Any], want: list[str], stop: str) -> list[int]:
    """The prompts (counted from 1) whose text is the reference's followed by ``stop`` and
    nothing more: the generate stopped there but kept the token."""
    return [
        i + 1
        for i, (g, w) in enumerate(zip(got, want, strict=False))
        if isinstance(g, str) and g == w + stop
    ]


def kept_stop_causes(got: list[Any], want: list[str], stop: str) -> dict[str, str]:
    """id -> text of the cause "stopped at ``stop`` but kept it", where the texts show it."""
    kept = kept_stop(got, want, stop)
    if not kept:
        return {}
    return {
        STOP_TOKEN_KEPT: (
            f"generate stopped at {stop} but kept it in the output (prompt(s) {kept}: the "
            f"reference's text, then {stop}, then nothing); the text must end before it: cut "
            "each sequence at its first stop token, leaving the token out"
        )
    }
