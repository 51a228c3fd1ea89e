"""What makes a prompt fit for check 4.6's timed runs, for ``regen``'s stored pool and for
a GPU workload's pool built in the grading: every greedy step of the reference's answer
beats the runner-up clearly, so another correct implementation's rounding cannot flip it."""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.core.thresholds import timed_rounds

MARGIN = 1e-3  # every expected greedy step beats the runner-up by this much
PROMPT_LEN = 8  # the handout's 8-token prompt


def min_gap(step_logits: np.ndarray) -> float:
    """The smallest best-minus-runner-up logit over every step and row."""
    ordered = np.sort(step_logits.astype(np.float64), axis=-1)
    return float((ordered[..., -1] - ordered[..., -2]).min())


def runs_per_grading(bench: dict[str, Any]) -> int:
    """Timed runs of check 4.6 in one grading under profile ``bench`` at most: each one
    gets a prompt of its own (every mode, every L, every round)."""
    return 2 * len(bench["L_values"]) * timed_rounds(bench)
