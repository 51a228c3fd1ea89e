"""grader/grading/runner.py: what a grading tells whom."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from grader.grading.runner import grade
from grader.sandbox.identity import resolve_identity
from tests.conftest import FAST_LIMITS, SOLUTION


@pytest.mark.parametrize("public_only", [False, True])
def test_sandbox_warnings_reach_a_ta_not_a_students_self_check(
    public_only: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A student grading their own code cannot act on the sandbox's security warnings:
    the self-check (a public-only run) keeps them in results.json and prints none."""
    identity = dataclasses.replace(resolve_identity(), warning="a test warning")
    path = tmp_path / "results.json"
    grade(SOLUTION, results_path=path, parts=["part1"], limits=FAST_LIMITS,
          identity=identity, public_only=public_only)  # fmt: skip
    printed = "warning: a test warning" in capsys.readouterr().err
    assert printed is not public_only
    stored = json.loads(path.read_text())["extra_data"]["sandbox_warnings"]
    assert "a test warning" in stored
