"""Check 3.10's temperature probe (grader/parts/part3/sampling.py): the draws are judged
against the distribution of the logits the submission sampled from, and a sampling
mistake is named only where that distribution shows it."""

from __future__ import annotations

import numpy as np

from grader.parts.part3.cases import SAMPLE_TEMPERATURE, SAMPLE_TOP_P, nucleus_distribution
from grader.parts.part3.sampling import judge_draws, own_band

TEXTS = [f"t{i}" for i in range(8)]
PROBE = {"prompt": "p", "temperature": SAMPLE_TEMPERATURE, "top_p": SAMPLE_TOP_P,
         "rows": 16, "calls": 32}  # fmt: skip


def logits_of(values: list[float], rows: int = 16) -> np.ndarray:
    """(steps=1, rows, vocab) last-position logits, every row the same prompt."""
    return np.tile(np.array(values, np.float32), (1, rows, 1))


def draws(logits: list[float], temperature: float) -> list[str]:
    """The texts a sampler at ``temperature`` draws, in the exact expected proportions."""
    probs = nucleus_distribution(np.array(logits), temperature, SAMPLE_TOP_P)
    n = PROBE["rows"] * PROBE["calls"]
    counts = np.round(probs * n).astype(int)
    counts[np.argmax(counts)] += n - counts.sum()
    return [TEXTS[i] for i, c in enumerate(counts) for _ in range(c)]


# The reference's logits, and a model whose logits differ (e.g. RoPE applied twice).
REFERENCE = [2.2, 0.8, 0.3, 0.5, -1.0, -0.2, 1.2, -0.2]
OTHER = [1.1, 1.6, 1.2, 3.0, 1.6, 1.9, -0.8, 0.2]


def test_a_right_sampler_on_other_logits_passes_by_its_own_logits() -> None:
    reference = own_band(logits_of(REFERENCE), TEXTS, 1e-4)
    own = own_band(logits_of(OTHER), TEXTS, 1e-4)
    assert reference is not None and own is not None
    drawn = draws(OTHER, SAMPLE_TEMPERATURE)
    judged = judge_draws(drawn, PROBE, reference)
    assert not judged.passed  # against the reference's distribution it would fail...
    assert judge_draws(drawn, PROBE, own).passed  # ...but it samples its own logits right


def test_temperature_ignored_is_named_from_the_own_distribution() -> None:
    own = own_band(logits_of(OTHER), TEXTS, 1e-4)
    judged = judge_draws(draws(OTHER, 1.0), PROBE, own)
    assert not judged.passed and judged.names == ["temperature_ignored"]
    greedy = judge_draws([TEXTS[int(np.argmax(OTHER))]] * 512, PROBE, own)
    assert not greedy.passed and greedy.names == ["always_greedy"]


def test_logits_that_cannot_be_used_give_no_own_distribution() -> None:
    assert own_band(None, TEXTS, 1e-4) is None
    assert own_band(logits_of(REFERENCE), TEXTS[:-1], 1e-4) is None  # another vocabulary
    uneven = logits_of(REFERENCE)
    uneven[0, 3, 0] += 1.0  # rows of the same prompt disagree
    assert own_band(uneven, TEXTS, 1e-4) is None
    nan = logits_of(REFERENCE)
    nan[0, 0, 0] = np.nan
    assert own_band(nan, TEXTS, 1e-4) is None
    peaked = [30.0, 0, 0, 0, 0, 0, 0, 0]  # a greedy sampler would pass: cannot tell
    assert own_band(logits_of(peaked), TEXTS, 1e-4) is None
