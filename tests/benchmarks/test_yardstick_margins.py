"""benchmarks/yardstick_margins.py: how its gradings become margins (the gradings
themselves run by hand: docs/measurements/2026-11-26-yardstick.md)."""

from __future__ import annotations

from types import ModuleType

import pytest

from grader.ta.regen import import_path
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return import_path(ROOT / "benchmarks" / "yardstick_margins.py", "yardstick_margins_test")


def test_margins_take_each_gradings_largest_ratio(script: ModuleType) -> None:
    """A grading is judged on its worst batch; partial caches (stopped by other
    conditions) count on neither side."""
    rows = [
        {"kind": "reference", "name": "reference", "gradings": [[1.0, 1.2], [0.9, 1.1]]},
        {"kind": "correct", "name": "float64", "gradings": [[1.5, 1.3]]},
        {"kind": "partial", "name": "every-8th", "gradings": [[1.9, 2.1]]},
        {"kind": "cache-free", "name": "closer", "gradings": [[2.3, 4.0], [2.4, 3.8]]},
        {"kind": "cache-free", "name": "plain", "gradings": [[3.0, 9.0]]},
    ]
    m = script.margins(rows, 2.0)
    assert (m["worst_correct"], m["best_cache_free"]) == (1.5, 3.8)
    assert m["margin_correct"] == pytest.approx(2.0 / 1.5)
    assert m["margin_cache_free"] == pytest.approx(3.8 / 2.0)


def test_the_loose_profile_judges_every_part_with_an_unreachable_limit(
    script: ModuleType, tmp_path
) -> None:
    from grader.core.thresholds import parse_thresholds

    profile = parse_thresholds(script.loose_profile(tmp_path).read_text())
    for part in ("part2", "part3", "part4"):
        assert profile["cpu"][part]["max_vs_reference"] == 1000.0
