"""Gradescope's entry point: the optional submission limit, and the results file it
always writes."""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from grader.core.results import validate_results
from grader.grading import autograder
from grader.grading.autograder import SubmissionLimit, limit_verdict, over_limit_results
from tests.conftest import ROOT, SOLUTION

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def meta(*hours_ago: float, counted: bool = True, score: float = 7.0) -> dict:
    previous = [
        {
            "submission_time": (NOW - timedelta(hours=h)).isoformat(),
            "score": score,
            "results": {"extra_data": {} if counted else {"counted": False}},
        }
        for h in hours_ago
    ]
    return {"created_at": NOW.isoformat(), "previous_submissions": previous}


def test_no_limit_never_blocks() -> None:
    assert not limit_verdict(meta(1, 2, 3, 4, 5), SubmissionLimit(0, 24)).over


def test_limit_counts_only_the_window() -> None:
    limit = SubmissionLimit(3, 24)
    assert not limit_verdict(meta(1, 2), limit).over
    assert not limit_verdict(meta(1, 2, 30), limit).over  # one is older than 24 h
    verdict = limit_verdict(meta(1, 2, 23), limit)
    assert verdict.over and verdict.used == 3
    # The oldest of the three leaves the window 24 h after it was made.
    assert verdict.next_counts_at == NOW - timedelta(hours=23) + timedelta(hours=24)


def test_submissions_over_the_limit_do_not_count_towards_it() -> None:
    limit = SubmissionLimit(2, 24)
    assert not limit_verdict(meta(1, counted=True) | {}, limit).over
    data = meta(1, 2)
    data["previous_submissions"][1]["results"] = {"extra_data": {"counted": False}}
    assert not limit_verdict(data, limit).over


def test_over_limit_results_keep_the_last_score_and_say_when() -> None:
    limit = SubmissionLimit(1, 24)
    verdict = limit_verdict(meta(2, score=41.5), limit)
    results = over_limit_results(verdict, limit, max_score=80)
    data = results.to_gradescope()
    validate_results(data)
    assert data["score"] == 41.5
    assert "not graded" in data["output"] and "41.5 / 80" in data["output"]
    assert (NOW + timedelta(hours=22)).isoformat(timespec="minutes") in data["output"]
    assert data["extra_data"]["counted"] is False


def gradescope_tree(tmp_path: Path, metadata: dict) -> Path:
    root = tmp_path / "autograder"
    shutil.copytree(SOLUTION, root / "submission", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "results").mkdir()
    (root / "submission_metadata.json").write_text(json.dumps(metadata))
    return root


def test_main_refuses_a_submission_over_the_limit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(autograder, "load_limit", lambda: SubmissionLimit(2, 24))
    root = gradescope_tree(tmp_path, meta(1, 3, score=12.0))
    assert autograder.main(root=root, parts=["part1"]) == 0
    data = json.loads((root / "results" / "results.json").read_text())
    validate_results(data)
    assert data["score"] == 12.0 and data["tests"] == []


def test_main_grades_within_the_limit(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(autograder, "load_limit", lambda: SubmissionLimit(2, 24))
    root = gradescope_tree(tmp_path, meta(1, score=12.0))
    assert autograder.main(root=root, parts=["part1"]) == 0
    data = json.loads((root / "results" / "results.json").read_text())
    assert data["score"] == 20


def test_shipped_config_has_the_limit_off() -> None:
    assert autograder.load_limit() == SubmissionLimit(0, 24.0)


def test_only_one_worker_is_alive_at_a_time() -> None:
    from grader.runtime.context import GradingContext

    class FakeClient:
        def __init__(self) -> None:
            self.running = True
            self.stopped = 0

        def stop(self) -> None:
            self.running = False
            self.stopped += 1

    bases = {"part1": Path("."), "part2": Path(".")}
    ctx = GradingContext(sandbox=None, limits=None, device="cpu", bases=bases)  # type: ignore[arg-type]
    part1, part2 = FakeClient(), FakeClient()
    ctx._workers.update(part1=part1, part2=part2)
    assert ctx.worker("part2") is part2
    assert part1.stopped == 1 and part2.stopped == 0 and part2.running


@pytest.mark.slow
def test_grading_budget_fits_gradescope_defaults() -> None:
    """Whole run under 768 MB (PSS of parent and workers) and under 60 s on 2 cores."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grading_budget

    figures = grading_budget.measure(SOLUTION, half_cpu=False)
    assert figures["score"] == 104  # 100 and the Part 4 bonus
    assert figures["peak_pss_mib"] < 768
    assert figures["seconds"] < 60
