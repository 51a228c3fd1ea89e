"""What a cache-read probe's figure says, for the parts that scramble a cache (2 and 3).

The probe writes noise over the cache right after a prefill and runs single-token steps;
its figure is the largest change of the last step's logits. Each part words its verdict;
this reads the figure the same way for both.
"""

from __future__ import annotations

from typing import Any, Literal

Outcome = Literal["reads", "nan", "ignores"]


def cache_read_outcome(effect: Any, min_effect: float) -> Outcome | None:
    """None where there is no figure (no tensor that may hold the cache, or none could be
    written: the other probes judge alone); "reads" when the logits moved by more than
    ``min_effect``; "nan" when they were NaN (never a pass); "ignores" otherwise."""
    if not isinstance(effect, (int, float)) or isinstance(effect, bool):
        return None
    if effect > min_effect:  # NaN never is
        return "reads"
    return "nan" if effect != effect else "ignores"
