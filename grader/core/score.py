"""The one rule for adding up a grading, used by every view of it.

A check whose maximum is 0 and which awards points is extra credit (``points.BONUS``;
tagged ``bonus``). Its points are kept apart from the regular ones wherever a score is
shown ("77 / 86 + 4 bonus": a bonus never hides a failed check behind a full-looking
total), and the **total** is the regular points plus the bonus: what Gradescope adds up
and records, and what a score upload carries. The terminal table, ``show``, the page's
summary, ``scores.csv``, the upload sheet, ``summary.json``/``summary.md`` and both HTML
reports all read their numbers from :func:`score_of` and write them with
:meth:`Score.text`, so that one results file reads the same in each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from grader.core.points import BONUS
from grader.core.results import TestResult

#: A check as a view holds it: a :class:`TestResult`, or its entry of a results file.
Check = TestResult | Mapping[str, Any]


@dataclass(frozen=True)
class Score:
    """Points of a set of checks: the regular ones, the extra credit, and the maximum
    (which counts regular checks only: a bonus check's maximum is 0)."""

    regular: float = 0.0
    bonus: float = 0.0
    max_score: float = 0.0

    @property
    def total(self) -> float:
        """The regular points plus the bonus: what Gradescope records."""
        return self.regular + self.bonus

    def __add__(self, other: Score) -> Score:
        return Score(
            self.regular + other.regular, self.bonus + other.bonus, self.max_score + other.max_score
        )

    def text(self) -> str:
        """``"77 / 86 + 4 bonus"``, or ``"77 / 86"`` without extra credit."""
        shown = f"{self.regular:g} / {self.max_score:g}"
        return f"{shown} + {self.bonus:g} bonus" if self.bonus else shown


def _fields(check: Check) -> tuple[str, list[str], float, float]:
    """(number, tags, score, max_score) of a check in either form."""
    if isinstance(check, TestResult):
        return check.number, check.tags, float(check.score), float(check.max_score)
    return (
        str(check.get("number", "")),
        [str(t) for t in check.get("tags") or []],
        float(check.get("score") or 0.0),
        float(check.get("max_score") or 0.0),
    )


def is_bonus(check: Check) -> bool:
    """Extra credit: tagged ``bonus``, listed in ``points.BONUS``, or awarding points over
    a maximum of 0."""
    number, tags, score, max_score = _fields(check)
    return "bonus" in tags or number in BONUS or (max_score == 0 and score > 0)


def check_score(check: Check) -> Score:
    """One check's :class:`Score`."""
    _, _, score, max_score = _fields(check)
    if is_bonus(check):
        return Score(bonus=score)
    return Score(regular=score, max_score=max_score)


def points_label(check: Check) -> str:
    """One check's points as a report heads it: ``"0 / 2"``, or ``"4 bonus"``."""
    _, _, score, max_score = _fields(check)
    return f"{score:g} bonus" if is_bonus(check) else f"{score:g} / {max_score:g}"


def score_of(checks: Iterable[Check]) -> Score:
    """The :class:`Score` of ``checks`` added up."""
    total = Score()
    for check in checks:
        total += check_score(check)
    return total


def part_of_check(check: Check) -> str:
    """The part tag (``part1`` ... ``part4``) of a check in either form ("" for none)."""
    _, tags, _, _ = _fields(check)
    return next((t for t in tags if t.startswith("part")), "")


def part_scores(checks: Iterable[Check]) -> dict[str, Score]:
    """``{part: Score}`` in the order the parts first appear (checks of no part under "")."""
    scores: dict[str, Score] = {}
    for check in checks:
        part = part_of_check(check)
        scores[part] = scores.get(part, Score()) + check_score(check)
    return scores


def file_score(data: Mapping[str, Any]) -> Score:
    """A results file's :class:`Score`; a file without checks (a submission over the
    limit keeps its last score) counts its ``score`` as regular points."""
    tests = data.get("tests") or []
    if not tests:
        return Score(regular=float(data.get("score") or 0.0))
    return score_of(tests)


def points_text(score: float, max_score: float | None = None) -> str:
    """``"0 / 1 point"``, ``"0 / 2 points"``, ``"4 points"``: the unit agrees with the
    number it counts (the maximum where there is one)."""
    counted = score if max_score is None else max_score
    unit = "point" if counted == 1 else "points"
    shown = f"{score:g}" if max_score is None else f"{score:g} / {max_score:g}"
    return f"{shown} {unit}"
