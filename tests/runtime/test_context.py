"""The grading context: what one grading's checks share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SOLUTION, grade_checks


def test_seeded_weights_are_drawn_once_per_model_and_grading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.11 loads its benchmark model into the reference's worker (the yardstick) and the
    submission's: one draw serves both (a GPU workload's model takes a core 9 s to draw),
    and every model still gets its own weights."""
    from grader.parts.part2 import support

    drawn: list[str] = []
    real = support.make_state_dict

    def counted(spec):
        drawn.append(json.dumps(spec, sort_keys=True))
        return real(spec)

    monkeypatch.setattr(support, "make_state_dict", counted)
    graded = grade_checks(SOLUTION, tmp_path / "out", "part2", {"2.1", "2.11"})
    assert graded.score("2.11") == graded.test("2.11")["max_score"]
    assert graded.score("2.1") == graded.test("2.1")["max_score"]
    assert len(drawn) == len(set(drawn)) >= 3  # the public, benchmark and work-probe models


def test_a_seeded_draw_is_kept_by_what_it_was_drawn_from() -> None:
    from grader.runtime.context import GradingContext

    ctx = GradingContext.__new__(GradingContext)
    ctx._weights = {}
    calls: list[int] = []

    def draw(seed: int):
        return lambda: calls.append(seed) or {"w": seed}

    a = ctx.seeded_weights("part2", {"seed": 1}, draw(1))
    assert ctx.seeded_weights("part2", {"seed": 1}, draw(1)) is a
    assert ctx.seeded_weights("part2", {"seed": 2}, draw(2)) == {"w": 2}
    assert ctx.seeded_weights("part3", {"seed": 1}, draw(1)) == {"w": 1}
    assert calls == [1, 2, 1]
