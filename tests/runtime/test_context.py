"""The grading context: what one grading's checks share."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from tests.conftest import SOLUTION, Graded, grade_checks


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


def test_a_whole_grading_starts_each_submission_worker_once(solution_graded: Graded) -> None:
    """A part whose checks compare with the reference has it timed before the submission's
    worker first starts, so no reference session stops that worker halfway (each start
    builds its models again): Part 1's worker, per benchmark part the reference's and the
    submission's, and 3.11's own (memory) are 8 forks; a reference timed at the first
    check that compares made 11."""
    assert solution_graded.data["extra_data"]["worker_starts"] == {"fork server": 8}


def test_what_runs_before_a_parts_first_worker_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from grader.runtime import context

    def client(**kwargs):  # what the context builds, never started here
        return types.SimpleNamespace(part=kwargs["part"], running=False)

    monkeypatch.setattr(context, "WorkerClient", client)
    ctx = context.GradingContext.__new__(context.GradingContext)
    ctx.bases, ctx._workers, ctx.ahead = {"part2": Path("/sub"), "part3": Path("/sub")}, {}, {}
    for name in ("sandbox", "limits", "device", "threads"):
        setattr(ctx, name, None)
    calls: list[str] = []
    ctx.before_first_worker = {"part2": lambda: calls.append(f"before {list(ctx._workers)}")}
    assert ctx.worker("part2") is ctx.worker("part2")
    assert ctx.worker("part3").part == "part3"
    assert calls == ["before []"]  # before its worker existed, and once


def test_stopping_a_parts_worker_leaves_the_others_alone() -> None:
    from grader.runtime import context

    class Client:
        def __init__(self, running: bool) -> None:
            self.running, self.stopped = running, False

        def stop(self) -> None:
            self.stopped, self.running = True, False

    ctx = context.GradingContext.__new__(context.GradingContext)
    ctx._workers = {"part3": Client(True), "part4": Client(True), "part2": Client(False)}
    for part in ("part3", "part2", "part1"):  # running, stopped already, never started
        ctx.stop_worker(part)
    assert [c.stopped for c in ctx._workers.values()] == [True, False, False]
