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

    def start(path, pin, device):
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
