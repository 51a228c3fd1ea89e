"""The submission folders of a Gradescope export, as every TA command reads them.

An export is a folder the TA downloaded, but what lies in it came from students and from
whoever unpacked it: a submission "folder" that is a link would make ``batch`` grade, and
``similarity`` print into its report, whatever the link points at (another course's
files, a TA's home folder). Only real folders directly inside the export are
submissions; a link, or anything that resolves elsewhere, is skipped with a warning that
names it.

Gradescope's "Export Submissions" is a zip that unpacks to one folder
(``assignment_<id>_export/``) holding ``submission_metadata.yml`` and one folder per
submission (``submission_<id>/``). A TA may name either the folder the zip was unpacked
into or that folder itself: :func:`find_export` looks one level down when the metadata is
not where it was told, and takes the one folder that has it.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from grader.ta.regrade.outputs import natural_key

#: The export's list of submissions and their submitters.
METADATA = "submission_metadata.yml"


class ExportError(ValueError):
    """The export folder or its metadata cannot be used (the CLI exits with status 2)."""


def find_export(path: Path) -> Path:
    """The export folder for ``path``: ``path`` itself when it holds :data:`METADATA`,
    else the one folder directly inside it that does (where unzipping Gradescope's export
    puts it), announced on stderr. Several such folders, or none, is an
    :class:`ExportError` that says what was looked at."""
    path = Path(path)
    if (path / METADATA).is_file():
        return path
    if zipfile.is_zipfile(path):
        unzipped = path.with_suffix("")
        raise ExportError(
            f"{path} is a zip: unzip it first (unzip {path} -d {unzipped}), then name the "
            f"folder it made ({unzipped})"
        )
    if not path.is_dir():
        raise ExportError(f"cannot read {METADATA}: {path} is not a folder")
    below = sorted(
        (e for e in path.iterdir() if not e.name.startswith(".") and not e.is_symlink()),
        key=lambda e: natural_key(e.name),
    )
    found = [e for e in below if e.is_dir() and (e / METADATA).is_file()]
    if len(found) == 1:
        print(f"the export is {found[0]} (the folder in {path} that holds {METADATA})",
              file=sys.stderr)  # fmt: skip
        return found[0]
    if found:
        names = ", ".join(e.name for e in found)
        raise ExportError(
            f"{path} holds several exports ({names}): name the one to read, e.g. {found[0]}"
        )
    raise ExportError(
        f"cannot read {METADATA} in {path}, nor in a folder directly inside it: name the "
        "folder Gradescope's export unzipped to (it holds submission_metadata.yml and one "
        "submission_<id>/ folder per submission)"
    )


def refusal(entry: Path, export_dir: Path) -> str | None:
    """Why ``entry`` (a folder, or a link to one, inside ``export_dir``) is not read as a
    submission: it is a link, or it resolves outside the export; None when it is read."""
    target = entry.resolve()
    if entry.is_symlink():
        return f"it is a link (to {target}), not a folder of the export"
    if target.parent != export_dir.resolve():
        return f"it resolves outside the export (to {target})"
    return None


def submission_folders(
    export_dir: Path, *, skip: Path | None = None
) -> tuple[list[Path], list[str]]:
    """The submission folders of ``export_dir`` in natural order (every folder but hidden
    ones and ``skip``, the command's own output folder when it lies inside the export),
    and the names of those refused (:func:`refusal`), each warned about on stderr."""
    folders: list[Path] = []
    refused: list[str] = []
    for entry in export_dir.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue  # files, hidden folders and links to files are no submissions
        if skip is not None and skip in (entry, entry.resolve()):
            continue
        why = refusal(entry, export_dir)
        if why is None:
            folders.append(entry)
            continue
        refused.append(entry.name)
        print(f"warning: {entry.name} is skipped: {why}", file=sys.stderr)
    folders.sort(key=lambda p: natural_key(p.name))
    return folders, sorted(refused, key=natural_key)
