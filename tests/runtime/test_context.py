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
    ctx._lingering = {}
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


class _Client:
    """A worker client stand-in: running from the start, stopped by ``stop``."""

    def __init__(self, **kwargs) -> None:
        self.part, self.trusted = kwargs["part"], kwargs.get("trusted", False)
        self.running, self.starts = True, 1

    def stop(self) -> None:
        self.running = False


class _Sandbox:
    def __init__(self) -> None:
        self.copies: list[str] = []  # what the sandbox holds

    def provide(self, source, name, private=False):
        self.copies.append(name)
        return Path("/sandbox") / name

    def withdraw(self, name) -> None:
        self.copies = [c for c in self.copies if c != name]


@pytest.fixture
def bare_context(monkeypatch: pytest.MonkeyPatch):
    """A context whose workers and sandbox are stand-ins, and the clients it made."""
    from grader.runtime import context

    made: list[_Client] = []
    monkeypatch.setattr(
        context, "WorkerClient", lambda **kw: made.append(_Client(**kw)) or made[-1]
    )
    ctx = context.GradingContext(
        sandbox=_Sandbox(), limits=None, device="cpu", bases={"part2": Path("/sub")}
    )
    return ctx, made


def test_a_lingering_reference_session_is_taken_over_with_what_it_built(bare_context) -> None:
    """The prompt pools' session leaves the reference's worker running; the yardstick's
    takes it over, knowing the models it built, and then stops it and withdraws the
    reference's copy."""
    ctx, made = bare_context
    with ctx.reference_session("part2", linger=True) as first:
        ctx.built("part2")["bench"] = first.starts
    assert first.running and "reference" in ctx.sandbox.copies
    assert "part2.built" not in ctx.scratch  # the reference's models are not the submission's
    with ctx.reference_session("part2", keep=["part2.live_pools"]) as second:
        assert second is first and ctx.built("part2") == {"bench": 1}
    assert made == [first] and not first.running
    assert ctx.sandbox.copies == [] and "part2.built" not in ctx.scratch


def test_no_submission_worker_starts_beside_a_lingering_reference(bare_context) -> None:
    ctx, made = bare_context
    with ctx.reference_session("part2", linger=True) as reference:
        pass
    submission = ctx.worker("part2")
    assert not reference.running and ctx.sandbox.copies == []
    assert made == [reference, submission] and not submission.trusted


def test_a_submission_worker_made_earlier_waits_for_the_reference_to_end(bare_context) -> None:
    ctx, made = bare_context
    submission = ctx.worker("part2")
    with ctx.reference_session("part2", linger=True) as reference:
        assert not submission.running  # one worker at a time
    assert reference.running and ctx.worker("part2") is submission
    assert not reference.running and ctx.sandbox.copies == []
    assert made == [submission, reference]


def test_a_session_that_fails_or_closes_leaves_no_reference_running(bare_context) -> None:
    ctx, made = bare_context
    with pytest.raises(RuntimeError), ctx.reference_session("part2", linger=True):
        raise RuntimeError("the pool could not be built")
    assert not made[0].running and ctx.sandbox.copies == []
    with ctx.reference_session("part2", linger=True):
        pass
    ctx.close()
    assert not made[1].running and ctx.sandbox.copies == []
