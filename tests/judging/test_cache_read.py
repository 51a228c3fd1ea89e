"""A cache-read probe's figure, read the same way for Parts 2 and 3."""

from __future__ import annotations

import math

import pytest

from grader.judging.cache_read import cache_read_outcome


@pytest.mark.parametrize(
    ("effect", "outcome"),
    [
        (None, None),  # no tensor that may hold the cache: the other probes judge
        (True, None),  # not a figure
        ("1.0", None),
        (2.5, "reads"),
        (math.inf, "reads"),  # NaN only in the scrambled run: it read the noise
        (1e-3, "ignores"),  # at the line is not past it
        (0.0, "ignores"),
        (math.nan, "nan"),  # never a pass
    ],
)
def test_the_figure_is_read_the_same_way_by_both_parts(effect: object, outcome: str) -> None:
    assert cache_read_outcome(effect, 1e-3) == outcome
