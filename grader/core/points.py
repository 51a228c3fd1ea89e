"""Points for every graded check, as the parts' tables declare them.

Keys are the check numbers shown on Gradescope; a part's total is the sum of its checks.
Reweighting a check (or a part) is an edit of its ``points`` in
``grader/parts/<tag>/part.toml`` and nowhere else.
"""

from __future__ import annotations

from grader.core.registry import PARTS

#: Per part, check number -> points, from the part's table (``grader/parts/<tag>/part.toml``).
POINTS: dict[str, dict[str, float]] = {
    tag: {c.number: c.points for c in part.checks if not c.bonus} for tag, part in PARTS.items()
}
#: Extra credit: checks whose maximum is 0 and which award these points when passed.
BONUS: dict[str, float] = {
    c.number: c.bonus for part in PARTS.values() for c in part.checks if c.bonus
}


def bonus_total(part: str) -> float:
    """Extra-credit points a part can award beyond its maximum."""
    return float(sum(v for k, v in BONUS.items() if part_of(k) == part))


def part_of(number: str) -> str:
    """``"1.4"`` -> ``"part1"``."""
    return f"part{number.split('.')[0]}"


def points(number: str) -> float:
    """The weight of check ``number``."""
    return float(POINTS[part_of(number)][number])


def part_total(part: str) -> float:
    """Maximum score of a part."""
    return float(sum(POINTS[part].values()))
