"""Without the hidden answers (the student's self-check), Part 2's timed runs are judged
against the submission's own cache-free answers on the same prompts: a cached path that
computes other logits loses 2.9 there too, as it does on Gradescope."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grader.core.paths import TEST_CASES
from grader.ta.mutants import load_mutants
from tests.conftest import SOLUTION, patched_solution, run_grade

pytestmark = pytest.mark.xdist_group("part2_selfcheck_answers")


@pytest.fixture(scope="module")
def public_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test cases as the student zip holds them: public ones only."""
    root = tmp_path_factory.mktemp("cases")
    shutil.copytree(TEST_CASES / "public", root / "public")
    return root


def work_check(submission: Path, out: Path, cases: Path) -> dict:
    out.mkdir(parents=True)
    graded = run_grade(
        submission, out, parts=["part2"], device="cpu", cases_root=cases,
        public_only=True, numbers=frozenset({"2.9"}),
    )  # fmt: skip
    return graded.test("2.9")


def test_a_cached_path_that_differs_from_its_own_cache_free_path_fails_2_9(
    tmp_path: Path, public_cases: Path
) -> None:
    (mistake,) = [m for m in load_mutants("part2") if m.name == "mask_not_offset"]
    wrong = patched_solution(tmp_path / "sub", mistake.file, list(mistake.edits))
    verdict = work_check(wrong, tmp_path / "out", public_cases)
    assert verdict["status"] == "failed"
    assert "other tokens than the same round's generate(use_cache=False)" in verdict["output"]


def test_the_reference_keeps_2_9_without_the_hidden_answers(
    tmp_path: Path, public_cases: Path
) -> None:
    verdict = work_check(SOLUTION, tmp_path / "out", public_cases)
    assert verdict["status"] == "passed", verdict["output"]
