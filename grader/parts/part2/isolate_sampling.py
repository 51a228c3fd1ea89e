"""Check 2.10's sampler experiment: ``sample`` alone, on a distribution the grader chose,
with the temperature varied alone.

When 2.10 fails and the batch generate drew from is not to blame (:mod:`isolate`), the
grader calls the submission's ``sample(logits, temperature)`` directly, in the worker, on
``ROWS`` copies of fixed logits (``LOGITS``, none a whole number), seeded, at each of
``TEMPERATURES``, and compares how often each token was drawn with softmax(logits / T)
(every token within ``SIGMAS`` standard deviations). Each way of getting the temperature
wrong is a hypothesis about the temperature the draws follow (:data:`HYPOTHESES`); one is
named only when it fits the draws at every temperature and the handout's does not. When
``sample`` is right at every temperature, the sampler is not blamed: what ``generate``
hands it (its logits, its temperature) or its own way of drawing is. Part 2's sampler has
no top-p (the handout's ``sample(logits, temperature)``), so the temperature is the one
thing varied.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from grader.core.feedback_items import Cause
from grader.parts.part2.cases import softmax64
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part2.support import Part2Base

LOGITS = (1.3, 0.4, -0.2, -0.9, 0.7, -1.6, 0.1, -0.45)
TEMPERATURES = (1.0, 0.5, 2.0, 0.001)
ROWS, SIGMAS, SEED = 4096, 6.0, 2010

#: The temperature the draws follow, as each way of getting it wrong makes it, with the
#: cause's id and sentence: the handout's first.
HYPOTHESES: dict[str, tuple[Callable[[float], float], str]] = {
    "divided": (lambda t: t, ""),
    "ignored": (
        lambda t: 1.0,
        "your sample ignores the temperature: it draws from softmax(logits) at every "
        "temperature; divide the logits by it before the softmax",
    ),
    "multiplied": (
        lambda t: 1.0 / t,
        "your sample multiplies the logits by the temperature instead of dividing them by "
        "it: a low temperature then flattens the distribution instead of sharpening it",
    ),
    "twice": (
        lambda t: t * t,
        "your sample divides the logits by the temperature twice",
    ),
    "greedy": (
        lambda t: 1e-9,
        "your sample always returns the likeliest token (argmax), whatever the temperature: "
        "it must draw from softmax(logits / temperature) (torch.multinomial)",
    ),
    "uniform": (
        lambda t: 1e9,
        "your sample draws every token equally often, whatever the logits: the probabilities "
        "it draws from are not softmax(logits / temperature) over the vocabulary (dim=-1)",
    ),
}
SAMPLER_ID = "isolated:sampler_temperature_{}"
#: sample right at every temperature, generate's draws wrong.
GENERATE_ID = "isolated:generate_sampling_departs"
#: generate draws at a low temperature as at 1.0: the temperature never reaches the sampler.
TEMPERATURE_LOST = "isolated:generate_ignores_temperature"


@dataclass(frozen=True)
class Draws:
    """How often ``sample`` drew each token at each temperature (None: it failed)."""

    frequencies: dict[float, np.ndarray] | None
    raised: str = ""

    def fits(self, temperature_of: Callable[[float], float]) -> bool:
        """Whether the draws at every temperature follow softmax(LOGITS / that of it)."""
        if self.frequencies is None:
            return False
        z = np.array(LOGITS)
        for t, freq in self.frequencies.items():
            p = softmax64(z / temperature_of(t))
            band = SIGMAS * np.sqrt(p * (1 - p) / ROWS) + 1e-12
            if not np.all(np.abs(freq - p) <= band):
                return False
        return True

    def shown(self, t: float) -> str:
        """The likeliest token's frequency at ``t`` against softmax(LOGITS / t)."""
        assert self.frequencies is not None
        p = softmax64(np.array(LOGITS) / t)
        top = int(np.argmax(LOGITS))
        freq = self.frequencies[t][top]
        return f"at T={t:g} the likeliest token {freq:.3f} of the time (softmax: {p[top]:.3f})"


def draws(check: Part2Base) -> Draws:
    """``sample`` on ``ROWS`` copies of ``LOGITS`` at each of ``TEMPERATURES`` (once per
    grading)."""
    memo = check.ctx.scratch.setdefault("part2.sampler_draws", [])
    if not memo:
        memo.append(measure(check))
    return memo[0]


def measure(check: Part2Base) -> Draws:
    logits = np.tile(np.array(LOGITS, dtype=np.float32), (ROWS, 1))
    frequencies = {}
    for i, t in enumerate(TEMPERATURES):
        header = {"op": "sample", "model": "public", "temperature": t, "seed": SEED + i}
        what = f"sample(logits of shape {logits.shape}, {t:g}) (isolation)"
        try:
            reply = check.call(header, {"logits": logits}, what)
        except SubmissionError as exc:
            return Draws(None, exc.signature or exc.kind)
        tokens = np.asarray(reply.arrays.get("tokens")).reshape(-1)
        if tokens.size != ROWS or tokens.min() < 0 or tokens.max() >= len(LOGITS):
            return Draws(None, f"{tokens.size} token ids, not {ROWS} in 0..{len(LOGITS) - 1}")
        frequencies[t] = np.bincount(tokens, minlength=len(LOGITS)) / ROWS
    return Draws(frequencies)


def sampler_verdict(found: Draws) -> tuple[str | None, str]:
    """The hypothesis the draws single out ("divided": sample is right; None: none fits,
    or sample could not run) and the line of evidence."""
    temps = ", ".join(f"{t:g}" for t in TEMPERATURES)
    lead = f"sample(logits, T) alone, on {ROWS} copies of logits the grader chose, at T = {temps}"
    if found.frequencies is None:
        return None, f"{lead}: it failed ({found.raised})"
    fitting = [name for name, (h, _) in HYPOTHESES.items() if found.fits(h)]
    seen = "; ".join(found.shown(t) for t in TEMPERATURES[:3])
    if "divided" in fitting:
        return "divided", f"{lead}: it draws from softmax(logits / T) at every one ({seen})"
    if len(fitting) == 1:
        return fitting[0], f"{lead}: {seen}"
    return None, f"{lead}: no softmax(logits / T') of the logits fits ({seen})"


def sampler_cause(hypothesis: str | None, evidence: str) -> Cause | None:
    """The cause of a sampler found wrong in a way of :data:`HYPOTHESES` (None otherwise)."""
    if hypothesis in (None, "divided"):
        return None
    return Cause(SAMPLER_ID.format(hypothesis), HYPOTHESES[hypothesis][1], evidence)


def generate_cause(evidence: str) -> Cause:
    """sample is right at every temperature, but generate's draws are wrong."""
    return Cause(
        GENERATE_ID,
        "your sample is right at every temperature on its own, so what generate does with "
        "it is not: the logits or the temperature generate hands to sample (the last "
        "position's logits, (B, vocab), and generate's own temperature), or a draw of its "
        "own that does not call sample",
        evidence,
    )


def temperature_lost_cause(evidence: str) -> Cause:
    return Cause(
        TEMPERATURE_LOST,
        "your generate draws at a low temperature exactly as at 1.0, while sample alone "
        "honours the temperature: generate does not pass its temperature on to sample",
        evidence,
    )


#: The known mistakes of the library that are the sampler's, with the hypothesis each
#: makes the draws follow: a known cause the experiment contradicts is not named.
KNOWN_SAMPLER_MISTAKES = {"temperature_ignored": "ignored"}


def default_temperature_causes(check: Part2Base) -> tuple[list[Cause], list[str], bool]:
    """generate's draws at temperature 1.0 were wrong, the batch not to blame: the causes
    and lines of the sampler experiment, and whether the sampler may still be blamed."""
    hypothesis, evidence = sampler_verdict(draws(check))
    line = f"Narrowed by experiment: {evidence}."
    if hypothesis == "divided":
        return [generate_cause(evidence)], [line], False
    if (cause := sampler_cause(hypothesis, evidence)) is not None:
        return [cause], [line], True
    if draws(check).frequencies is not None:
        return [departs_cause(evidence)], [line], True
    return [], [line], True


def departs_cause(evidence: str) -> Cause:
    return Cause(
        SAMPLER_ID.format("departs"),
        "your sample, called alone, does not draw from softmax(logits / temperature) of the "
        "logits it is given",
        evidence,
    )


def low_temperature_causes(
    check: Part2Base, known: list[Cause], lost: Callable[[], str]
) -> tuple[list[Cause], list[str]]:
    """generate's tokens at a very low temperature were not all its model's top token; the
    catalogue named ``known``. The sampler experiment decides: a known sampler mistake it
    contradicts is dropped, one it confirms stands alone; a right sampler turns the blame
    to generate (``lost()``: the evidence that generate draws at a low temperature as at
    1.0, "" when it does not)."""
    found = draws(check)
    hypothesis, evidence = sampler_verdict(found)
    line = f"Narrowed by experiment: {evidence}."
    kept = [c for c in known if KNOWN_SAMPLER_MISTAKES.get(c.id, hypothesis) == hypothesis]
    if hypothesis is None and found.frequencies is None:
        return known, []
    if kept != known or not known:
        if hypothesis == "divided":
            shown = lost()
            cause = temperature_lost_cause(shown) if shown else generate_cause(evidence)
            return [*kept, cause], [line] + ([f"Narrowed by experiment: {shown}."] if shown else [])
        cause = sampler_cause(hypothesis, evidence) or departs_cause(evidence)
        return [*kept, cause], [line]
    return known, [line] if any(c.id in KNOWN_SAMPLER_MISTAKES for c in known) else []
