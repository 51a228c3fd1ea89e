"""benchmarks/verdict_stability.py and benchmarks/grading_budget.py: how their runs are
tallied and reported (the gradings themselves run under `make bench`)."""

from __future__ import annotations

from types import ModuleType

import pytest

from grader.regen import import_path
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def stability() -> ModuleType:
    return import_path(ROOT / "benchmarks" / "verdict_stability.py", "verdict_stability_test")


@pytest.fixture(scope="module")
def budget() -> ModuleType:
    return import_path(ROOT / "benchmarks" / "grading_budget.py", "grading_budget_test")


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


def test_budget_runs_report_scores_and_confirmations(
    budget: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    figures = iter(
        [
            {"score": 104, "seconds": 25.0, "failed": [], "confirmed": ["3.11"]},
            {"score": 102, "seconds": 27.0, "failed": [("3.11", "batch 8 speedup")],
             "confirmed": ["3.11"]},
            {"score": 104, "seconds": 24.0, "failed": [], "confirmed": []},
        ]
    )  # fmt: skip
    polls = []

    def fake_measure(submission, half_cpu, poll_s):
        polls.append(poll_s)
        return {"peak_rss_mib": 0.0, "peak_pss_mib": 0.0, **next(figures)}

    monkeypatch.setattr(budget, "measure", fake_measure)
    assert budget.main(["--runs", "3", "--poll-ms", "0"]) == 0
    out = capsys.readouterr().out
    assert polls == [0.0, 0.0, 0.0]
    assert "peak memory" not in out  # nothing was sampled
    assert "confirmation rounds in 3.11" in out and "check 3.11 failed" in out
    assert out.strip().splitlines()[-1] == (
        "3 gradings: 2 scored 104 (lowest 102); 2 needed confirmation rounds"
    )
