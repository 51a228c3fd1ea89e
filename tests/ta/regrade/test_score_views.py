"""One results file, rendered through every view that shows its score: the terminal table,
``show``, the page's summary, ``scores.csv``, ``summary.json``/``summary.md``, the upload
sheet, ``report.html`` and ``selfcheck_report.html`` all tell the same points, the bonus
apart (grader/core/score.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from grader import cli
from grader.core.feedback import markdown_results
from grader.core.results import GradingResults, TestResult, write_results
from grader.core.terminal import score_table
from grader.grading.runner import summary
from grader.grading.selfcheck_page import render as selfcheck_page
from grader.ta.regrade import merge
from grader.ta.regrade.class_page import render as class_page
from grader.ta.regrade.outputs import BatchSummary, Submitter, make_row, write_outputs

#: 77 of 86 regular points and the 4-point bonus: Gradescope records 81.
TOTAL = "77 / 86 + 4 bonus"
PART4 = "20 / 20 + 4 bonus"


def check(number: str, score: float, max_score: float, *tags: str) -> TestResult:
    status = "passed" if score >= max_score else "failed"
    part = f"part{number.split('.')[0]}"
    return TestResult(f"{number} a check", score, max_score, status, number,
                      "It raised NotImplementedError." if status == "failed" else "",
                      [part, *tags])  # fmt: skip


def one_results_file(path: Path) -> dict:
    """The file a grading writes: Markdown feedback, the summary on top."""
    results = GradingResults(tests=[
        check("1.1", 11, 20), check("2.1", 30, 30), check("3.1", 16, 16),
        check("4.1", 20, 20), check("4.7", 4, 0, "bonus"),
    ])  # fmt: skip
    results.output = summary(results, [])
    return write_results(markdown_results(results), path)


@pytest.fixture(scope="module")
def views(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every view of one results file, as text."""
    root = tmp_path_factory.mktemp("views")
    batch = root / "batch"
    data = one_results_file(batch / "results" / "submission_1" / "results.json")
    row = make_row("submission_1", [Submitter("Ada", "1001", "ada@x")], data, "graded")
    write_outputs(BatchSummary(batch, [row], {"graded": 1}, {"mean": row.total, "median":
                  row.total, "min": row.total, "max": row.total}, [], 1.0))  # fmt: skip
    merge.main(cpu=batch, gpu=None, out_dir=root / "sheet")
    results = GradingResults.from_gradescope(data)
    return {
        "table": score_table(results),
        "page": data["output"],
        "scores.csv": (batch / "scores.csv").read_text(),
        "summary.json": (batch / "summary.json").read_text(),
        "summary.md": (batch / "summary.md").read_text(),
        "upload": (root / "sheet" / "scores.csv").read_text(),
        "report.html": class_page([row], {"submission_1": data}, "class"),
        "selfcheck_report.html": selfcheck_page(data, {}),
    }


def test_every_text_view_writes_the_same_total_with_the_bonus_apart(
    views: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("table", "page", "report.html", "selfcheck_report.html"):
        assert TOTAL in views[name], (name, views[name])
        assert "81 / 86" not in views[name] and "24 / 20" not in views[name], name
    for name in ("table", "page", "selfcheck_report.html"):
        assert PART4 in views[name], (name, views[name])
    path = tmp_path / "results.json"
    one_results_file(path)
    assert cli.main(["show", str(path), "--no-details"]) == 0
    shown = capsys.readouterr().out
    assert f"TOTAL  {TOTAL}" in shown and f"part4  {PART4}" in shown


def test_the_sheets_count_the_same_points_in_their_columns(views: dict[str, str]) -> None:
    [row] = csv.DictReader(views["scores.csv"].splitlines())
    assert (row["score"], row["bonus"], row["total"], row["max_score"]) == ("77", "4", "81", "86")
    assert row["part4"] == "20"  # its regular points; the bonus is its own column
    [upload] = csv.DictReader(views["upload"].splitlines())
    assert (upload["Total Score"], upload["Max Points"], upload["Bonus"]) == ("81", "86", "4")
    assert upload["part4"] == "20"
    doc = json.loads(views["summary.json"])
    assert (doc["score"]["mean"], doc["bonus"]["mean"], doc["total"]["mean"]) == (77, 4, 81)
    assert doc["bonus"]["submissions"] == 1
    assert "the bonus apart: mean 77.00" in views["summary.md"]
    assert "1 submission earned extra credit" in views["summary.md"]
