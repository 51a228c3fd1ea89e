"""grader/core/score.py: the one rule every view adds a grading up by."""

from __future__ import annotations

from grader.core.results import TestResult
from grader.core.score import (
    Score,
    file_score,
    is_bonus,
    part_scores,
    points_label,
    points_text,
    score_of,
)


def test_the_bonus_is_kept_apart_and_the_total_holds_it() -> None:
    tests = [
        TestResult("4.1", 16, 20, "failed", "4.1", tags=["part4"]),
        TestResult("4.7", 4, 0, "passed", "4.7", tags=["part4", "bonus"]),
    ]
    score = score_of(tests)
    assert score == Score(16, 4, 20) and score.total == 20
    assert score.text() == "16 / 20 + 4 bonus" and Score(3, 0, 4).text() == "3 / 4"
    assert part_scores(tests) == {"part4": score}
    as_dicts = [t.to_gradescope() for t in tests]
    assert score_of(as_dicts) == score and file_score({"tests": as_dicts}) == score
    assert [points_label(t) for t in tests] == ["16 / 20", "4 bonus"]


def test_a_check_is_extra_credit_by_tag_by_number_or_by_its_zero_maximum() -> None:
    assert is_bonus({"number": "4.7", "score": 0, "max_score": 0})  # points.BONUS
    assert is_bonus({"number": "9.9", "score": 1, "max_score": 0})
    assert not is_bonus({"number": "1.1", "score": 0, "max_score": 2})


def test_a_file_without_checks_keeps_its_score() -> None:
    assert file_score({"score": 42, "tests": []}) == Score(42, 0, 0)


def test_the_unit_agrees_with_its_number() -> None:
    assert points_text(0, 1) == "0 / 1 point" and points_text(1, 2) == "1 / 2 points"
    assert points_text(1) == "1 point" and points_text(4) == "4 points"
