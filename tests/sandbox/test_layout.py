"""The submission laid over the assignment's given files: folders, flat uploads, what the
kit supplies and what a student must upload."""

from __future__ import annotations

from pathlib import Path

from grader.core.paths import ASSIGNMENT
from grader.core.registry import PARTS
from grader.sandbox.layout import lay_out, lay_out_part

PART3 = PARTS["part3"]


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_edited_files_in_their_folder_get_the_given_ones(tmp_path: Path) -> None:
    touch(tmp_path / "llama" / "model.py", "# mine")
    touch(tmp_path / "llama" / "generation.py", "# mine")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    assert layout.base == tmp_path and not layout.missing and not layout.moved
    assert sorted(layout.supplied) == sorted(PART3.given)
    for rel in PART3.given:
        assert (tmp_path / rel).read_bytes() == (ASSIGNMENT / rel).read_bytes()
    assert (tmp_path / "llama" / "model.py").read_text() == "# mine"


def test_edited_files_uploaded_flat_are_graded_in_their_package(tmp_path: Path) -> None:
    touch(tmp_path / "model.py", "# model")
    touch(tmp_path / "generation.py", "# generation")
    touch(tmp_path / "question1.py", "# part 1 stays where it is")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    assert layout.base == tmp_path and not layout.missing
    assert (tmp_path / "llama" / "model.py").read_text() == "# model"
    assert (tmp_path / "llama" / "generation.py").read_text() == "# generation"
    assert not (tmp_path / "model.py").exists()
    assert (tmp_path / "question1.py").is_file()
    assert layout.moved == [
        "model.py (as llama/model.py)",
        "generation.py (as llama/generation.py)",
    ]
    assert "llama/tokenizer.py" in layout.supplied


def test_one_edited_file_in_its_folder_and_the_other_flat_are_graded_together(
    tmp_path: Path,
) -> None:
    """A student who uploads ``llama/model.py`` and then drags ``generation.py`` in alone."""
    touch(tmp_path / "llama" / "model.py", "# model")
    touch(tmp_path / "generation.py", "# generation")
    touch(tmp_path / "tokenizer.py", "# a stray file of the same name as a given one")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    assert layout.base == tmp_path and not layout.missing
    assert layout.moved == ["generation.py (as llama/generation.py)"]
    assert (tmp_path / "llama" / "generation.py").read_text() == "# generation"
    # Beside an upload in its folder, a flat given file is not taken for the package's.
    assert (tmp_path / "llama" / "tokenizer.py").read_bytes() == (
        ASSIGNMENT / "llama" / "tokenizer.py"
    ).read_bytes()
    assert "llama/tokenizer.py" in layout.supplied


def test_the_main_file_flat_and_the_other_in_its_folder_are_graded_together(
    tmp_path: Path,
) -> None:
    touch(tmp_path / "model.py", "# model")
    touch(tmp_path / "llama" / "generation.py", "# generation")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    assert layout.base == tmp_path and not layout.missing
    assert layout.moved == ["model.py (as llama/model.py)"]
    assert (tmp_path / "llama" / "generation.py").read_text() == "# generation"


def test_flat_files_in_a_subfolder_are_found(tmp_path: Path) -> None:
    touch(tmp_path / "my-hw" / "part3" / "model.py")
    touch(tmp_path / "my-hw" / "part3" / "generation.py")
    touch(tmp_path / "my-hw" / "part3" / "tokenizer.py", "# my own tokenizer")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    base = tmp_path / "my-hw" / "part3"
    assert layout.base == base
    assert (base / "llama" / "tokenizer.py").read_text() == "# my own tokenizer"
    assert "llama/tokenizer.py" not in layout.supplied


def test_an_uploaded_given_file_is_kept(tmp_path: Path) -> None:
    touch(tmp_path / "assignment" / "llama" / "model.py")
    touch(tmp_path / "assignment" / "llama" / "generation.py")
    touch(tmp_path / "assignment" / "llama" / "tokenizer.py", "# the course's tokenizer")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    assert layout.base == tmp_path / "assignment"
    assert (layout.base / "llama" / "tokenizer.py").read_text() == "# the course's tokenizer"
    assert "llama/tokenizer.py" not in layout.supplied
    assert "llama/__init__.py" in layout.supplied


def test_a_missing_edited_file_is_named_once_with_what_to_upload(tmp_path: Path) -> None:
    touch(tmp_path / "llama" / "model.py")
    layout = lay_out_part(tmp_path, PART3, ASSIGNMENT)
    assert layout.base is None and layout.missing == ["llama/generation.py"]
    assert not layout.supplied  # nothing is added to a part that cannot be graded
    message = layout.missing_message(PART3)
    assert message.count("llama/generation.py") == 2  # what is missing, what to upload
    assert "Upload llama/model.py and llama/generation.py" in message


def test_a_part_with_nothing_uploaded_is_missing_its_main_file(tmp_path: Path) -> None:
    touch(tmp_path / "question1.py")
    layouts = lay_out(tmp_path, ["part1", "part2"], ASSIGNMENT)
    assert layouts["part1"].base == tmp_path and not layouts["part1"].missing
    assert layouts["part2"].base is None
    assert layouts["part2"].missing == ["transformer_skeleton.py"]
    assert "Upload transformer_skeleton.py" in layouts["part2"].missing_message(PARTS["part2"])


def test_given_files_exist_in_the_assignment_unchanged_from_the_solution() -> None:
    solution = ASSIGNMENT.parent / "solution"
    for part in PARTS.values():
        for rel in part.given:
            assert (ASSIGNMENT / rel).read_bytes() == (solution / rel).read_bytes(), rel
