"""Check 2.10's isolating experiment: is the sampler to blame, or the logits it drew from?

2.10 draws the first new token from ``generate`` on many copies of one prompt in a batch,
with the cache, and judges the draws against ``softmax(logits / T)`` of a cache-free
forward of the prompt alone. A forward that is right for one prompt and wrong for a batch
(or wrong in its cached prefill) makes those draws wrong with a sampler that is right, so
before the sampler is named, the grader varies one thing at a time on the same prompt:

1. the batch the draws came from, through the cached prefill ``generate`` runs, against
   the prompt alone without the cache (what the draws were judged against);
2. where they differ, the prompt alone through the same cached prefill: if it too differs
   the prefill is to blame, else the batch is.

Run only when the sampling check already failed; a request that fails leaves the sampler's
cause to be named as before (nothing is said that the evidence does not show).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from grader.core.feedback_items import Cause
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part2.support import Part2Base

#: A forward that gives a prompt in a batch other logits than the prompt alone.
BATCH_ROWS_DIFFER = "isolated:batch_rows_differ"
#: A cached prefill of the prompt alone that gives other logits than the cache-free forward.
PREFILL_DIFFERS = "isolated:cached_prefill_differs"


@dataclass(frozen=True)
class Departure:
    """Where a batch's last-position logits depart from one row's: the first row that
    departs (counted from 1), how many rows there are, and the largest difference."""

    row: int
    rows: int
    error: float

    def where(self) -> str:
        return f"first at row {self.row} of {self.rows}, off by up to {self.error:.3g}"


def departure(alone: np.ndarray, batch: np.ndarray, atol: float) -> Departure | None:
    """Compare ``batch`` (B, vocab) row by row with ``alone`` (vocab,); None when every row
    is within ``atol`` (NaN never is). A batch of the wrong shape departs at row 1."""
    alone = np.asarray(alone, dtype=np.float64)
    batch = np.asarray(batch, dtype=np.float64)
    if batch.ndim != 2 or batch.shape[1:] != alone.shape:
        return Departure(1, int(batch.shape[0]) if batch.ndim else 1, float("inf"))
    err = np.abs(batch - alone[None, :]).max(axis=-1)
    bad = ~(err <= atol)
    if not bad.any():
        return None
    return Departure(int(np.argmax(bad)) + 1, int(err.size), float(np.nanmax(err, initial=0.0)))


def last_logits(check: Part2Base, ids: np.ndarray, cached: bool, what: str) -> np.ndarray | None:
    """The submission's last-position logits (B, vocab) of ``ids``: one cached call (the
    prefill generate runs) or one cache-free call; None if it failed or returned no
    (B, T, vocab) array."""
    try:
        logits, _ = check.forward("public", ids, [ids.shape[1]] if cached else None, what=what)
    except SubmissionError:
        return None
    if not isinstance(logits, np.ndarray) or logits.ndim != 3 or len(logits) != len(ids):
        return None
    return logits[:, -1]


def sampling_not_to_blame(check: Part2Base, prompt: list[list[int]], rows: int) -> Cause | None:
    """The cause, other than the sampler, of draws from ``rows`` copies of ``prompt`` that
    do not follow softmax(logits) of the prompt alone; None when the batch's cached prefill
    gives the prompt alone's logits in every row (then the sampler may be named)."""
    ids = np.array(prompt, dtype=np.int64)
    atol = check.atol()
    alone = last_logits(check, ids, False, "forward (no cache) of the sampling prompt")
    batch = np.repeat(ids, rows, axis=0)
    what = f"forward (cached prefill) of {rows} copies of the sampling prompt"
    together = last_logits(check, batch, True, what)
    if alone is None or together is None:
        return None
    alone = alone[0]
    off = departure(alone, together, atol)
    if off is None:
        return None
    single = last_logits(check, ids, True, "forward (cached prefill) of the sampling prompt")
    if single is None:
        return None
    if (prefill := departure(alone, single, atol)) is not None:
        return Cause(
            PREFILL_DIFFERS,
            "your forward with use_cache=True gives a prompt fed in one call other logits "
            "than without the cache, and generate samples from the cached ones (see check 2.3)",
            f"forward(use_cache=True) of the prompt alone, in one call, gives other "
            f"last-position logits than without the cache, off by up to {prefill.error:.3g} "
            f"(tolerance {atol:g})",
        )
    off = departure(single[0], together, atol) or off
    return batch_cause(
        f"forward(use_cache=True) of {rows} copies of the prompt, the batch generate drew "
        f"from, gives other last-position logits than the prompt alone, {off.where()} "
        f"(tolerance {atol:g})",
    )


def batch_cause(evidence: str) -> Cause:
    """A forward right for a prompt alone and wrong for it in a batch, as ``evidence``
    showed (check 2.10's draws, or the forward checks' batch of different prompts)."""
    return Cause(
        BATCH_ROWS_DIFFER,
        "your forward gives other logits for a prompt in a batch than for the prompt alone: "
        "every row of a batch must be computed as if it were alone (look at what mixes the "
        "batch dimension with another: a view, reshape or transpose)",
        evidence,
    )
