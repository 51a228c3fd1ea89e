"""benchmarks/grading_budget.py: what it reports over several gradings (the gradings
themselves run under `make budget`; the slow test in test_autograder.py runs one)."""

from __future__ import annotations

from types import ModuleType

import pytest

from grader.ta.regen import import_path
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def budget() -> ModuleType:
    return import_path(ROOT / "benchmarks" / "grading_budget.py", "grading_budget_test")


def test_budget_runs_report_scores_and_confirmations(
    budget: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    figures = iter(
        [
            {"score": 104, "seconds": 25.0, "cpu_seconds": 21.5, "failed": [],
             "confirmed": ["3.11"], "timed_runs": (36, 2)},
            {"score": 102, "seconds": 27.0, "cpu_seconds": 24.0,
             "failed": [("3.11", "batch 8 speedup")], "confirmed": ["3.11"],
             "timed_runs": (42, 9)},
            {"score": 104, "seconds": 24.0, "cpu_seconds": 20.0, "failed": [], "confirmed": [],
             "timed_runs": (36, 0)},
        ]
    )  # fmt: skip
    polls = []

    def fake_measure(submission, half_cpu, poll_s, shared=None):
        assert shared is None  # each grading imports for itself, as on Gradescope
        polls.append(poll_s)
        return {"peak_rss_mib": 0.0, "peak_pss_mib": 0.0, **next(figures)}

    monkeypatch.setattr(budget, "measure", fake_measure)
    assert budget.main(["--runs", "3", "--poll-ms", "0"]) == 0
    out = capsys.readouterr().out
    assert polls == [0.0, 0.0, 0.0]
    assert "peak memory" not in out  # nothing was sampled
    assert "confirmation rounds in 3.11" in out and "check 3.11 failed" in out
    assert "9 of 42 timed runs stalled" in out
    assert "25.0 s (21.5 CPU s)" in out  # what the grading cost, beside its wall time
    assert out.strip().splitlines()[-1] == (
        "3 gradings: 2 scored 104 (lowest 102); 2 needed confirmation rounds; 11 of 114 timed "
        "runs stalled by > 150 ms (slower than the fastest run of their variant)"
    )


def test_shared_gradings_are_offered_the_one_shared_server_closed_after(
    budget: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``--shared``: every grading is offered a server forked from one shared fork server,
    as a class regrade's are, and the shared one is closed after the last."""
    events = []

    class Shared:
        def close(self) -> None:
            events.append("closed")

    shared = Shared()
    monkeypatch.setattr(budget, "shared_server", lambda **kw: shared)

    def fake_measure(submission, half_cpu, poll_s, offered=None):
        events.append(offered is shared)
        figures = {"score": 104, "seconds": 14.0, "cpu_seconds": 13.5, "failed": []}
        return {**figures, "peak_rss_mib": 0.0, "peak_pss_mib": 0.0, "confirmed": [],
                "timed_runs": (36, 0)}  # fmt: skip

    monkeypatch.setattr(budget, "measure", fake_measure)
    assert budget.main(["--runs", "2", "--poll-ms", "0", "--shared"]) == 0
    assert events == [True, True, "closed"]
    assert "workers forked from a shared fork server" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # its workers would not be pinned with the grader
        budget.main(["--shared", "--half-cpu"])
    assert events == [True, True, "closed"]


def test_stalled_runs_counts_runs_well_above_their_fastest(budget: ModuleType) -> None:
    record = {"timings": {"cached": {"runs_s": [0.010, 0.012, 0.300]},
                          "plain": {"runs_s": [0.50, 0.62, 0.64, 0.70]}}}  # fmt: skip
    assert budget.stalled_runs({"3.11": record, "4.6": {"timings": {}}}) == (7, 2)
    assert budget.stalled_runs({}) == (0, 0)
