"""benchmarks/verdict_stability.py: how its runs are tallied and reported (the
gradings themselves run under `make stability`)."""

from __future__ import annotations

from types import ModuleType

import pytest

from grader.ta.regen import import_path
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def stability() -> ModuleType:
    return import_path(ROOT / "benchmarks" / "verdict_stability.py", "verdict_stability_test")


def run(stability: ModuleType, passed: tuple[bool, bool, bool], ratio: float, confirmed: bool):
    return {
        "passed": dict(zip(stability.CHECKS, passed, strict=True)),
        "ratios": {"part3.min_speedup.1": ratio},
        "confirmed": confirmed,
    }


def test_tally_counts_verdicts_confirmations_and_ratio_ranges(stability: ModuleType) -> None:
    runs = [
        run(stability, (True, True, True), 3.1, False),
        run(stability, (True, True, True), 2.2, True),  # a miss re-measured, then passed
        run(stability, (True, False, True), 1.4, True),
        run(stability, (False, False, False), 1.0, True),
    ]
    t = stability.tally(runs)
    assert (t["runs"], t["all_passed"], t["all_failed"], t["confirmed"]) == (4, 2, 1, 3)
    assert t["per_check"] == {"2.11": 3, "3.11": 2, "4.6": 3}
    assert t["ratio_ranges"] == {"part3.min_speedup.1": [1.0, 3.1]}
    table = stability.markdown({"half-cpu": {"reference": t}})
    assert table.splitlines()[-1] == "| half-cpu | reference | 2/4 | 1/4 | 3 / 2 / 3 | 3/4 |"


def test_paired_runs_start_every_submission_before_waiting_and_stop_at_the_deadline(
    stability: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """``paired``: each run's gradings share the machine (all started, then awaited); no run
    starts after the deadline; the runs so far are handed over after each run."""
    events: list[str] = []
    clock = iter([0.0, 0.0, 5.0, 6.0, 9.0, 11.0, 12.0])  # the deadline (10) falls after run 2
    monkeypatch.setattr(stability.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(stability, "hog", lambda cpu: pytest.fail("paired runs need no hog"))

    def start(path, pin, device, parts=(), shared=None, whole=False):
        events.append(f"start {path.name}")
        return path.name, None

    def finish(name, out, device="cpu"):
        events.append(f"finish {name}")
        return run(stability, (name == "ref",) * 3, 1.0, False)

    monkeypatch.setattr(stability, "start_grading", start)
    monkeypatch.setattr(stability, "finish_grading", finish)
    seen: list[int] = []
    subs = {"reference": tmp_path / "ref", "cache-free": tmp_path / "cf"}
    found = stability.run_condition(
        "paired", 5, subs, "cuda", until=10.0, on_run=lambda f: seen.append(len(f["reference"]))
    )
    assert events[:4] == ["start ref", "start cf", "finish ref", "finish cf"]
    assert len(found["reference"]) == len(found["cache-free"]) == 2
    assert seen == [1, 2]


def test_paired_runs_keep_at_most_jobs_gradings_running(
    stability: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """``--jobs 2``: as in a class regrade, a third grading starts only when one ends, and
    each is offered a server forked from one shared fork server, closed after the runs;
    each entry is graded on its own parts."""
    events: list[str] = []

    class Shared:
        def close(self) -> None:
            events.append("closed")

    shared = Shared()
    monkeypatch.setattr(stability, "shared_server", lambda **kw: shared)

    def start(path, pin, device, parts=(), offered=None, whole=False):
        assert offered is shared
        events.append(f"start {path.name} {','.join(parts) or 'all'}")
        return path.name, None

    def finish(name, out, device="cpu"):
        events.append(f"finish {name}")
        return run(stability, (True,) * 3, 1.0, False)

    monkeypatch.setattr(stability, "start_grading", start)
    monkeypatch.setattr(stability, "finish_grading", finish)
    subs = {
        "reference": tmp_path / "ref",
        "a": stability.Entry(tmp_path / "a", ("part2",)),
        "b": stability.Entry(tmp_path / "b", ("part3", "part4")),
    }
    stability.run_condition("paired", 1, subs, "cpu", jobs=2)
    assert events == [
        "start ref all", "start a part2", "finish ref", "start b part3,part4", "finish a",
        "finish b", "closed",
    ]  # fmt: skip


def test_a_partial_cache_is_judged_on_its_own_parts_only(stability: ModuleType) -> None:
    """A Part 2 design fails 2.11 in every run: stable, though 3.11 and 4.6 (not graded)
    read as failed too; one run in which it passes 2.11 is not."""
    entry = stability.Entry(ROOT, ("part2",))
    assert entry.checks == ("2.11",)
    failing = [run(stability, (False, False, False), 1.0, False)] * 3
    t = stability.tally(failing, entry.checks)
    assert (t["all_failed"], t["per_check"]) == (3, {"2.11": 0})
    ref = stability.Entry(ROOT, expect_pass=True)
    passing = [run(stability, (True, True, True), 4.0, False)] * 3
    entries = {"reference": ref, "partial": entry}
    summary = {"busy": {"reference": stability.tally(passing), "partial": t}}
    assert stability.stable(summary, entries)
    slipped = [*failing[:2], run(stability, (True, False, False), 1.0, False)]
    summary["busy"]["partial"] = stability.tally(slipped, entry.checks)
    assert not stability.stable(summary, entries)
    assert "| busy | partial | 1/3 | 2/3 | 1 / - / - |" in stability.markdown(summary)


def test_a_correct_variant_may_miss_once_like_the_reference(stability: ModuleType) -> None:
    variant = stability.Entry(ROOT, ("part2", "part3"), expect_pass=True)
    runs = [run(stability, (True, True, False), 4.0, False)] * 19
    runs += [run(stability, (False, True, False), 2.0, True)]
    t = stability.tally(runs, variant.checks)
    assert stability.stable({"paired": {"v": t}}, {"v": variant})
    t2 = stability.tally(runs[:18] + runs[-1:] * 2, variant.checks)
    assert not stability.stable({"paired": {"v": t2}}, {"v": variant})


def test_a_failure_is_kept_by_its_reasons_not_its_table(stability: ModuleType) -> None:
    feedback = (
        "**Failed: 0 / 3 points.**\n\nTimed by the grader on **cpu**, **cpu** threshold "
        "profile.\n\n| measure | measured | runs | needed | met |\n|---|---|---|---|---|\n"
        "| speed-up | 9.1x | 3 | 3.47x | yes |\n\nYour cached path does not read its cache: "
        "its time cannot count."
    )
    kept = stability.reasons(feedback)
    assert kept == "Your cached path does not read its cache: its time cannot count."
    data = {"tests": [{"number": "2.11", "status": "failed", "output": feedback}]}
    assert stability.verdicts_of(data)["failures"] == {"2.11": kept}


def test_whole_runs_grade_every_check_of_the_parts(
    stability: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """``--whole``: each grading runs every check (no ``--tags benchmark``), so the benchmarks
    and the reference's runs come where a real grading has them; by default, only the
    benchmarks. Both conditions hand the choice down to every grading."""
    commands: list[list[str]] = []

    class Started:
        def __init__(self, command, **kwargs) -> None:
            commands.append(command)

    monkeypatch.setattr(stability.subprocess, "Popen", Started)
    for whole in (False, True):
        stability.start_grading(tmp_path, None, "cpu", ("part3",), whole=whole)
    assert commands[0][-4:-2] == ["--tags", "benchmark"]
    assert "--tags" not in commands[1] and commands[1][-2:] == ["--parts", "part3"]

    asked: list[bool] = []

    def start(path, pin, device, parts=(), shared=None, whole=False):
        asked.append(whole)
        return path.name, None

    monkeypatch.setattr(stability, "start_grading", start)
    monkeypatch.setattr(
        stability, "finish_grading", lambda *a, **k: run(stability, (True,) * 3, 1.0, False)
    )
    monkeypatch.setattr(stability, "shared_server", lambda **kw: None)
    stability.run_condition("paired", 1, {"reference": tmp_path / "ref"}, "cpu", whole=True)
    assert asked == [True]
