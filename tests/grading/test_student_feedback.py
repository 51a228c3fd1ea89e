"""Messages a student reads: the score table with a bonus, and the traceback of an
exception raised inside a library called from the submission."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from grader.core.results import GradingResults, TestResult
from grader.core.terminal import score_table
from grader.ta.regen import import_path
from tests.conftest import ROOT


@pytest.fixture
def describe_exception(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The worker's ``describe_exception`` (the worker imports its siblings by name)."""
    worker_dir = ROOT / "grader" / "worker"
    monkeypatch.syspath_prepend(str(worker_dir))
    main: ModuleType = import_path(worker_dir / "main.py", "worker_main_feedback_test")
    return main.describe_exception


def result(number: str, score: float, max_score: float, passed: bool, *tags: str) -> TestResult:
    return TestResult(
        name=f"{number} check",
        score=score,
        max_score=max_score,
        status="passed" if passed else "failed",
        number=number,
        tags=["part4", *tags],
    )


def test_a_bonus_never_makes_a_failed_part_look_full() -> None:
    results = GradingResults(
        tests=[
            result("4.5", 4, 4, True),
            result("4.6", 0, 4, False),
            result("4.7", 4, 0, True, "bonus"),
        ]
    )
    table = score_table(results)
    assert "part4  4 / 8 + 4 bonus" in table
    assert "TOTAL  4 / 8 + 4 bonus" in table
    assert "8 / 8" not in table
    line = next(x for x in table.splitlines() if "4.7" in x)
    assert line.startswith("  PASS") and line.endswith("4 bonus")


def test_without_a_bonus_the_table_is_plain() -> None:
    table = score_table(GradingResults(tests=[result("4.5", 4, 4, True)]))
    assert "part4  4 / 4" in table and "bonus" not in table


def test_traceback_shows_the_submissions_frames_not_torchs(
    tmp_path: Path, describe_exception: Any
) -> None:
    (tmp_path / "student.py").write_text(
        "import torch\n\n\ndef run():\n    layer = torch.nn.Linear(2, 3)\n"
        "    return layer(torch.zeros(4, 5))\n"
    )
    spec = importlib.util.spec_from_file_location("student_under_test", tmp_path / "student.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.run()
    except RuntimeError as exc:
        described = describe_exception(exc, tmp_path.resolve())
    else:
        raise AssertionError("the shapes should not multiply")
    assert described["where"] == "student.py, line 6, in run"
    assert 'File "student.py", line 6, in run' in described["traceback"]
    assert "module.py" not in described["traceback"]  # torch's own frames
    assert "linear.py" not in described["traceback"]


def test_traceback_keeps_library_frames_when_none_is_the_submissions(
    describe_exception: Any,
) -> None:
    import torch

    try:
        torch.nn.Linear(2, 3)(torch.zeros(4, 5))
    except RuntimeError as exc:
        described = describe_exception(exc, Path("/nonexistent-submission"))
    assert "linear.py" in described["traceback"]


def test_check_titles_are_whole_sentences_on_gradescope_and_in_the_table(solution_graded) -> None:
    """A docstring whose title wraps onto a second line is the test's whole name, and the
    terminal table wraps a long name instead of cutting it."""
    names = {t["number"]: t["name"] for t in solution_graded.data["tests"]}
    assert names["4.2"].endswith("gives the reference tokens")
    assert names["4.6"].endswith("and at L = 256 the cache is faster")
    assert names["4.7"].endswith("greedy agreement)")
    table = score_table(GradingResults.from_gradescope(solution_graded.data), width=72)
    lines = table.splitlines()
    for number in ("4.2", "4.6", "4.7"):
        first = next(i for i, x in enumerate(lines) if x[8:].startswith(f"{number} "))
        title = [lines[first][8:58].strip()]  # the name column, before the points
        for more in lines[first + 1 :]:
            if not more.startswith(" " * 8):
                break
            title.append(more.strip())
        assert " ".join(title) == names[number], number
    assert "..." not in table


def test_a_syntax_error_names_its_place_once_and_shows_the_line(
    tmp_path: Path, describe_exception: Any
) -> None:
    (tmp_path / "question1.py").write_text("def ok():\n    return 1\n\nx = = 1\n")
    try:
        compile((tmp_path / "question1.py").read_text(), str(tmp_path / "question1.py"), "exec")
    except SyntaxError as exc:
        described = describe_exception(exc, tmp_path.resolve())
    assert described["where"] == "question1.py, line 4"
    assert "line 4" not in described["message"]  # `where` names it, once
    assert described["message"].endswith("the line reads: x = = 1")
