"""Points live in one table that matches the checks exactly."""

from __future__ import annotations

from grader.core.points import POINTS, part_of, part_total, points
from grader.grading.runner import check_classes


def test_every_check_has_points_and_every_entry_a_check() -> None:
    numbers = set()
    for cls in check_classes("part1"):
        for name in dir(cls):
            if name.startswith("test_"):
                numbers.add(getattr(cls, name).__number__)
    assert numbers == set(POINTS["part1"])


def test_weights_come_from_the_table() -> None:
    for cls in check_classes("part1"):
        for name in dir(cls):
            if name.startswith("test_"):
                fn = getattr(cls, name)
                assert fn.__weight__ == points(fn.__number__)
                assert part_of(fn.__number__) in fn.__tags__


def test_part1_total() -> None:
    assert part_total("part1") == 20
