"""Laying a submission over the assignment's given files.

Students upload the files they edited, not the whole assignment: Part 3's
``llama/model.py`` and ``llama/generation.py`` without the ``tokenizer.py`` and
``__init__.py`` they never touched, or the same two files flat (``model.py`` at the
top). As Gradescope autograders usually do, the grader starts from the assignment's
given files and lays the upload over them:

- a part's folder is where its main file is (:func:`locate`), in its package folder or
  flat; files of a package uploaded flat (``model.py`` beside no ``llama/``, or
  ``generation.py`` beside ``llama/model.py``) are moved into the package folder;
- every given file the upload lacks is copied from the kit (and listed, so the results
  can say which files were supplied); an uploaded given file is kept as it is;
- a file the student must edit and did not upload is named, once, with what to upload.

This runs on the sandbox's copy of the submission, before it is handed to the worker.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.core.registry import PARTS, Part
from grader.sandbox.identity import WorkerIdentity
from grader.sandbox.notebook import NotebookError
from grader.sandbox.notebook_child import NotConverted, convert_notebook
from grader.sandbox.submission import locate


@dataclass
class PartLayout:
    """Where one part's files are in the sandbox's copy, and what the grader did to them."""

    base: Path | None  # the folder the part's files are relative to; None: not graded
    supplied: list[str] = field(default_factory=list)  # given files copied from the kit
    moved: list[str] = field(default_factory=list)  # flat uploads moved into a package
    missing: list[str] = field(default_factory=list)  # files to edit that were not uploaded
    converted: list[str] = field(default_factory=list)  # notebooks graded as scripts
    unreadable: str = ""  # why a notebook that stands for the main file could not be read

    def missing_message(self, part: Part) -> str:
        """What to upload, for a part that cannot be graded ("" if it can)."""
        if not self.missing:
            return ""
        if self.unreadable:
            return (
                f"{self.unreadable}, so {part.tag} was not graded. Upload "
                f"{part.main_file}, or the notebook saved again from Jupyter, and resubmit."
            )
        files = " and ".join(part.edited)
        where = "in their folder or flat" if "/" in part.main_file else "flat or in a folder"
        lacking = ", ".join(self.missing)
        verb = "is" if len(self.missing) == 1 else "are"
        return (
            f"{lacking} {verb} not in your submission, so {part.tag} was not graded. "
            f"Upload {files} ({where}) and resubmit."
        )


def part_files(root: Path, part: Part) -> tuple[Path | None, dict[str, Path]]:
    """Where ``part``'s files are in an upload: the part's base folder (None when its main
    file is nowhere, in its folder or flat), and each of its files found, by its path in
    the assignment (``llama/generation.py``), in its folder or flat beside it.

    Uploaded in its folder, the main file may have a file to edit flat beside the folder
    (a given file of the same name there is a stray, not the package's: the kit's is
    used). Uploaded flat, every package file beside it belongs to the package."""
    base, flat_ok = locate(root, part.main_file), part.edited
    main = PurePosixPath(part.main_file)
    if base is None and main.parent != PurePosixPath("."):
        base, flat_ok = locate(root, main.name), (*part.edited, *part.given)
    if base is None:
        return None, {}
    found = {}
    for rel in (*part.edited, *part.given):
        in_place, flat = base / rel, base / PurePosixPath(rel).name
        if in_place.is_file():
            found[rel] = in_place
        elif rel in flat_ok and flat.is_file():
            found[rel] = flat
    return base, found


def _script_from_notebook(
    root: Path, part: Part, identity: WorkerIdentity | None
) -> tuple[list[str], str]:
    """For a part whose main file was not uploaded: where it takes a notebook, write the
    script that ``<main>.ipynb`` defines beside it (read by a limited child, as
    ``identity``'s worker account). Returns what was converted (for the results) and, for
    a notebook that cannot be read, why."""
    notebook = PurePosixPath(part.main_file).with_suffix(".ipynb").as_posix()
    if not part.notebook or not (base := locate(root, notebook)):
        return [], ""
    path, script = base / notebook, base / part.main_file
    shown = path.relative_to(root).as_posix()
    try:
        converted = convert_notebook(path, identity)
    except NotConverted as exc:
        return [], f"{shown} could not be turned into a script: {exc}"
    except NotebookError as exc:
        return [], f"{shown} could not be read as a notebook: {exc}"
    try:
        script.write_text(converted.script, encoding="utf-8")
    except OSError as exc:  # a folder of that name in the upload, say
        return [], f"{shown} could not be graded as {part.main_file}: {exc.strerror}"
    return [f"{shown} (as {part.main_file}: {converted.summary()})"], ""


def lay_out_part(
    root: Path, part: Part, given_root: Path, identity: WorkerIdentity | None = None
) -> PartLayout:
    """Find ``part``'s files under ``root`` and complete them from ``given_root``; a
    notebook standing for the main file is read as ``identity``'s worker account."""
    converted, unreadable = [], ""
    base, found = part_files(root, part)
    if base is None:
        converted, unreadable = _script_from_notebook(root, part, identity)
        base, found = part_files(root, part) if converted else (None, {})
    if base is None:
        return PartLayout(None, missing=[part.main_file], unreadable=unreadable)
    layout = PartLayout(base, converted=converted)
    for rel, path in found.items():
        target = base / rel
        if path != target:  # uploaded flat: into its package folder
            target.parent.mkdir(parents=True, exist_ok=True)
            path.rename(target)
            layout.moved.append(
                f"{path.relative_to(root).as_posix()} (as {target.relative_to(root)})"
            )
    layout.missing = [rel for rel in part.edited if not (base / rel).is_file()]
    if layout.missing:
        layout.base = None
        return layout
    for rel in part.given:
        target, source = base / rel, given_root / rel
        if target.exists() or not source.is_file():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        layout.supplied.append(rel)
    return layout


def lay_out(
    root: Path, tags: Iterable[str], given_root: Path, identity: WorkerIdentity | None = None
) -> dict[str, PartLayout]:
    """:func:`lay_out_part` for each part of ``tags``, in order (each sees earlier moves)."""
    return {tag: lay_out_part(root, PARTS[tag], given_root, identity) for tag in tags}
