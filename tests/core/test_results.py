"""Results become a valid Gradescope file, and an invalid one is never written."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from grader.core.results import (
    GradingResults,
    TestResult,
    fallback_results,
    truncate,
    validate_results,
    write_results,
)


def sample() -> GradingResults:
    return GradingResults(
        tests=[
            TestResult("1.1 a", 2, 2, number="1.1", tags=["part1"]),
            TestResult("2.1 b", 0.5, 3, status="failed", number="2.1", tags=["part2"], output="x"),
        ],
        output="summary",
        execution_time=1.234,
    )


def test_results_serialise_to_a_valid_file(tmp_path: Path) -> None:
    data = write_results(sample(), tmp_path / "r" / "results.json")
    on_disk = json.loads((tmp_path / "r" / "results.json").read_text())
    assert on_disk == data
    validate_results(on_disk)
    assert on_disk["score"] == 2.5
    assert on_disk["tests"][1]["status"] == "failed"
    assert sample().by_part() == {"part1": (2, 2), "part2": (0.5, 3)}


def test_schema_rejects_what_gradescope_rejects() -> None:
    good = sample().to_gradescope()
    validate_results(good)
    for broken in (
        {**good, "tests": [{"name": "x", "status": "ok"}]},
        {**good, "visibility": "secret"},
        {**good, "score": "20"},
        {"output": "no score and no tests"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_results(broken)


def test_invalid_results_are_replaced_by_a_valid_fallback(tmp_path: Path) -> None:
    bad = sample()
    bad.tests[0].score = float("nan")
    data = write_results(bad, tmp_path / "results.json")
    validate_results(data)
    assert data["score"] == 0
    assert "invalid results file" in data["output"]


def test_fallback_is_valid() -> None:
    validate_results(fallback_results("boom", max_score=20))


def test_long_output_is_truncated_at_both_ends() -> None:
    text = "A" * 5000 + "B" * 5000
    cut = truncate(text, 1000)
    assert len(cut) < 1100
    assert cut.startswith("A") and cut.endswith("B")
    assert "characters cut" in cut


def test_a_results_file_reads_back_as_the_same_results() -> None:
    results = GradingResults(
        tests=[
            TestResult("1.1 a", 1.0, 2.0, "failed", number="1.1", output="why", tags=["part1"]),
            TestResult("1.2 b", 3.0, 3.0, number="1.2", extra_data={"k": [1, 2]}),
        ],
        output="summary",
        execution_time=12.5,
        leaderboard=[{"name": "speedup", "value": 3.0}],
        extra_data={"profile": "cpu"},
    )
    again = GradingResults.from_gradescope(results.to_gradescope())
    assert again == results
    assert again.score == 4.0


def test_a_results_file_without_tests_keeps_its_score() -> None:
    """A run that failed before any check (a broken image) has a score but no tests."""
    again = GradingResults.from_gradescope({"score": 5.0, "output": "over the limit"})
    assert again.tests == [] and again.score == 5.0 and again.output == "over the limit"
