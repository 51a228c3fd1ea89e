"""Submissions are found wherever the files were uploaded, and copied without links."""

from __future__ import annotations

import os
from pathlib import Path

from grader.sandbox.submission import MAX_FILES, MAX_NAMED, copy_submission, locate


def touch(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_locate_prefers_top_level_then_assignment_then_shallowest(tmp_path: Path) -> None:
    touch(tmp_path / "deep" / "er" / "question1.py")
    touch(tmp_path / "b" / "question1.py")
    touch(tmp_path / "a" / "question1.py")
    assert locate(tmp_path, "question1.py") == tmp_path / "a"
    touch(tmp_path / "assignment" / "question1.py")
    assert locate(tmp_path, "question1.py") == tmp_path / "assignment"
    touch(tmp_path / "question1.py")
    assert locate(tmp_path, "question1.py") == tmp_path


def test_locate_nested_package_path(tmp_path: Path) -> None:
    touch(tmp_path / "hw" / "llama" / "model.py")
    assert locate(tmp_path, "llama/model.py") == tmp_path / "hw"
    assert locate(tmp_path, "llama/generation.py") is None


def test_locate_ignores_macos_metadata(tmp_path: Path) -> None:
    touch(tmp_path / "__MACOSX" / "question1.py")
    assert locate(tmp_path, "question1.py") is None


def test_copy_refuses_links_and_keeps_regular_files(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    touch(src / "question1.py", "print(1)")
    secret = touch(tmp_path / "secret.json", "answers")
    os.symlink(secret, src / "answers.json")
    os.symlink(tmp_path, src / "escape")
    report = copy_submission(src, dst)
    assert report.copied == ["question1.py"]
    assert (dst / "question1.py").read_text() == "print(1)"
    assert not (dst / "answers.json").exists()
    assert not (dst / "escape").exists()
    assert any("answers.json" in r and "link" in r for r in report.refused)
    assert any("escape" in r for r in report.refused)


def test_copy_refuses_special_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    os.mkfifo(src / "pipe")
    report = copy_submission(src, tmp_path / "dst")
    assert report.refused == ["pipe (not a regular file)"]


def test_an_upload_of_many_files_is_graded_from_its_first_and_its_page_stays_short(
    tmp_path: Path,
) -> None:
    """Past the file cap every file is refused; the first refusals are named, the rest
    counted in one line (30,000 names made the page 1.7 MB)."""
    src = tmp_path / "src"
    touch(src / "question1.py")
    for i in range(MAX_FILES + MAX_NAMED + 123):
        touch(src / "junk" / f"f{i:05d}.txt")
    report = copy_submission(src, tmp_path / "dst")
    assert len(report.copied) == MAX_FILES and "question1.py" in report.copied
    assert len(report.refused) == MAX_NAMED and report.unnamed == 124
    notes = report.notes()
    assert len(notes) == MAX_NAMED + 1 and notes[0].endswith("(the submission is too large)")
    assert notes[-1].startswith("Not graded: 124 more files or folders of the same upload")
