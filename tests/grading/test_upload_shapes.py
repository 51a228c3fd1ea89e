"""Graded as students hand it in: the files they edited, alone, in their folder or flat.

The grader lays the upload over the assignment's given files (the tokenizer,
``__init__.py``, the course's scripts), so the reference's two edited Part 3 files score
what the whole reference scores, and the page says which files were supplied."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grader.core.points import POINTS
from grader.core.registry import PARTS
from tests.conftest import EXPERIMENT_CELLS, SOLUTION, grade_checks, notebook_from_script

PART3 = PARTS["part3"]
#: Every Part 3 check but the benchmark: the upload's shape decides whether the package
#: imports and what it holds, which every one of these checks depends on; the timed
#: check is graded on an upload of this shape in run-local and batch.
UNTIMED = {f"3.{n}" for n in range(1, 11)}


def upload(dest: Path, *, flat: bool, files: tuple[str, ...] = PART3.edited) -> Path:
    """The reference's ``files`` copied into ``dest``, flat or in their folders."""
    for rel in files:
        target = dest / (Path(rel).name if flat else rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOLUTION / rel, target)
    return dest


@pytest.mark.parametrize("flat", [False, True], ids=["in-their-folder", "flat"])
def test_the_two_edited_files_alone_score_full_marks(tmp_path: Path, flat: bool) -> None:
    graded = grade_checks(
        upload(tmp_path / "upload", flat=flat), tmp_path / "out", "part3", UNTIMED
    )
    failed = {
        t["number"]: t.get("output", "")[:300]
        for t in graded.data["tests"]
        if t["score"] < t["max_score"]
    }
    assert not failed
    assert graded.results.score == graded.results.max_score > 0
    files = graded.results.extra_data["files"]["part3"]
    assert sorted(files["supplied"]) == sorted(PART3.given)
    assert bool(files["moved"]) is flat
    assert "Supplied from the assignment" in graded.results.output
    assert "ModuleNotFoundError" not in str(graded.data)


def test_a_missing_edited_file_is_named_by_the_first_check_and_once_on_the_page(
    tmp_path: Path,
) -> None:
    submission = upload(tmp_path / "upload", flat=False, files=(PART3.main_file,))
    graded = grade_checks(submission, tmp_path / "out", "part3", {"3.1", "3.2"})
    assert graded.results.score == 0
    assert graded.results.output.count("llama/generation.py is not in your submission") == 1
    first, other = graded.shown("3.1"), graded.shown("3.2")
    assert first.count("llama/generation.py is not in your submission") == 1
    assert "upload the files named above" in first
    assert "3.1 says which to upload" in other and "not in your submission" in other
    assert "upload the files named above" not in other  # nothing above it to upload
    for shown in (first, other):
        assert "selfcheck" not in shown  # the self-check cannot help with a missing file
    assert graded.results.extra_data["files"]["part3"]["missing"] == ["llama/generation.py"]


def lab_notebook(dest: Path) -> Path:
    """The reference's kv_lab.py as a student's notebook, its experiment cells after it."""
    return notebook_from_script(SOLUTION / "kv_lab.py", dest, EXPERIMENT_CELLS)


def test_the_lab_handed_in_as_a_notebook_is_graded_as_its_script(tmp_path: Path) -> None:
    """The course's lab handout accepts "your Python notebook (.ipynb) or script file
    (.py)": the reference's lab as a notebook scores what the script scores, and the page
    says what was graded and what was not run."""
    untimed = set(POINTS["part4"]) - {"4.6"}  # the upload decides what imports, not speed
    graded = grade_checks(lab_notebook(tmp_path / "upload"), tmp_path / "out", "part4", untimed)
    failed = {t["number"]: t.get("output", "")[:300] for t in graded.data["tests"]
              if t["score"] < t["max_score"]}  # fmt: skip
    assert not failed
    assert graded.results.score == graded.results.max_score > 0
    (converted,) = graded.results.extra_data["files"]["part4"]["converted"]
    # Not run: the module's docstring, its `if __name__ == "__main__":` and the five
    # statements of the experiment cells; left out: the `%matplotlib` line.
    assert converted.startswith("kv_lab.ipynb (as kv_lab.py: kept ")
    assert converted.endswith("not run: 7 other top-level statements; left out: 1 IPython line)")
    assert "Graded from your notebook: kv_lab.ipynb" in graded.results.output
