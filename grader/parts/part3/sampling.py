"""Check 3.10's temperature probe, judged in trusted code: the texts ``generate`` drew as
its first token against the distribution of the logits it drew them from.

A submission is judged by its own model's logits for the probe's prompt, as recorded
in the worker when it generated: a model whose logits differ from the reference's (a
prompt without BOS, RoPE applied twice) loses the checks of its logits and texts, not
the sampling check, when it samples from its own logits as Meta's code does. Where
those logits cannot be read, or give a distribution in which a greedy sampler or one
that ignores the temperature could pass, the reference's stored distribution is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.parts.part3.cases import sampling_band


@dataclass(frozen=True)
class SamplingVerdict:
    """What the drawn texts show against one expected distribution (``band``)."""

    passed: bool
    lines: list[str]  # why not, for the student ([] when passed)
    names: list[str]  # the catalogued sampling mistakes the draws show


def own_band(step_logits: Any, token_texts: Any, atol: float) -> dict[str, Any] | None:
    """The expected distribution of the first drawn token from the submission's own
    last-position logits of its first forward call (``step_logits``: (steps, rows,
    vocab), every row the same prompt); None where they cannot be used: missing, of
    another vocabulary than ``token_texts``, not finite, rows that disagree by more
    than ``atol``, or a distribution that cannot tell the mistakes apart."""
    if not isinstance(step_logits, np.ndarray) or step_logits.ndim != 3 or not step_logits.size:
        return None
    rows = step_logits[0].astype(np.float64)  # (rows, vocab)
    if not isinstance(token_texts, list) or rows.shape[1] != len(token_texts):
        return None
    if not np.isfinite(rows).all() or not np.abs(rows - rows[0]).max() <= atol:
        return None
    return sampling_band(rows[0], token_texts)


def judge_draws(drawn: list[str], probe: dict[str, Any], band: dict[str, Any]) -> SamplingVerdict:
    """``drawn`` (the texts of every call and row) against ``band``, the nucleus and the
    likeliest text's frequency band of the distribution they were drawn from."""
    n = probe["rows"] * probe["calls"]
    top, p, width = band["top_text"], band["top_probability"], band["band"]
    outside = sorted({t for t in drawn if t not in band["nucleus"]})
    freq = drawn.count(top) / n
    if len(drawn) == n and not outside and abs(freq - p) <= width:
        return SamplingVerdict(True, [], [])
    setting = f"temperature={probe['temperature']}, top_p={probe['top_p']}"
    lines = [
        f"generate({setting}) was asked {n} times for one token after "
        f"{probe['prompt']!r} (seeds 0 to {probe['calls'] - 1}, {probe['rows']} rows each)."
    ]
    if len(drawn) != n:
        lines.append(f"It returned {len(drawn)} texts.")
    if outside:
        lines.append(
            f"{len(outside)} of the texts it drew lie outside the top-p nucleus of "
            f"softmax(logits / {probe['temperature']}), e.g. {outside[:3]}."
        )
    lines.append(
        f"The likeliest token ({top!r}, probability {p:.2f}) came up {freq:.2f} of the "
        f"time (accepted: {max(0.0, p - width):.2f} to {min(1.0, p + width):.2f})."
    )
    names = []
    if drawn and freq == 1.0:
        names.append("always_greedy")
    elif abs(freq - band["top_probability_at_1"]) <= width:
        names.append("temperature_ignored")
    return SamplingVerdict(False, lines, names)
