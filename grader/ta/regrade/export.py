"""The submission folders of a Gradescope export, as every TA command reads them.

An export is a folder the TA downloaded, but what lies in it came from students and from
whoever unpacked it: a submission "folder" that is a link would make ``batch`` grade, and
``similarity`` print into its report, whatever the link points at (another course's
files, a TA's home folder). Only real folders directly inside the export are
submissions; a link, or anything that resolves elsewhere, is skipped with a warning that
names it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grader.ta.regrade.report import natural_key


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
