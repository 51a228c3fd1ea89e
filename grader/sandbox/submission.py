"""Finding and copying a submission's files.

Students upload files flat (``question1.py``) or inside their folders
(``assignment/question1.py``, ``my-hw/llama/model.py``). The grader copies
regular files only: symlinks, devices and anything outside the submission
folder are refused and reported, so a submission cannot point the grader at
the test data.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

IGNORED_DIRS = frozenset({"__pycache__", ".git", "__MACOSX", ".ipynb_checkpoints", ".venv"})
MAX_FILES = 2000
MAX_FILE_BYTES = 50 * 2**20
MAX_TOTAL_BYTES = 200 * 2**20
MAX_DEPTH = 16  # folders below the submission's top; deeper ones are refused
MAX_NAMED = 50  # refusals named one by one on the page; the rest are counted


@dataclass
class CopyReport:
    """What was copied and what was refused, with the reason for each refusal: the first
    :data:`MAX_NAMED` by name, the others counted, so that an upload of a hundred thousand
    files gets a page of a few lines."""

    copied: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    unnamed: int = 0  # refusals past MAX_NAMED

    def refuse(self, what: str) -> None:
        """Record one refusal: ``what`` and why."""
        if len(self.refused) < MAX_NAMED:
            self.refused.append(what)
        else:
            self.unnamed += 1

    def notes(self) -> list[str]:
        """The refusals as the page says them."""
        notes = [f"Not graded: {r}" for r in self.refused]
        if self.unnamed:
            notes.append(
                f"Not graded: {self.unnamed:,} more files or folders of the same upload (the "
                f"first {MAX_NAMED} are named above)."
            )
        return notes


def copy_submission(src: Path, dst: Path) -> CopyReport:
    """Copy the regular files under ``src`` into ``dst``, never following links."""
    report = CopyReport()
    total = 0
    src = src.resolve()
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(src)
        if len(rel_dir.parts) >= MAX_DEPTH and dirnames:
            report.refuse(f"{rel_dir}/* (folders nested deeper than {MAX_DEPTH})")
            dirnames[:] = []
        kept = []
        for name in sorted(dirnames):
            path = here / name
            if name in IGNORED_DIRS:
                continue
            if path.is_symlink():
                report.refuse(f"{rel_dir / name}/ (a symbolic link)")
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = rel_dir / name
            info = os.lstat(here / name)
            if stat.S_ISLNK(info.st_mode):
                report.refuse(f"{rel} (a symbolic link)")
            elif not stat.S_ISREG(info.st_mode):
                report.refuse(f"{rel} (not a regular file)")
            elif info.st_size > MAX_FILE_BYTES:
                report.refuse(f"{rel} (larger than {MAX_FILE_BYTES // 2**20} MiB)")
            elif len(report.copied) >= MAX_FILES or total + info.st_size > MAX_TOTAL_BYTES:
                report.refuse(f"{rel} (the submission is too large)")
            else:
                target = dst / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                _copy_regular_file(here / name, target)
                total += info.st_size
                report.copied.append(str(rel))
    return report


def _copy_regular_file(source: Path, target: Path) -> None:
    # O_NOFOLLOW: a file swapped for a link between the walk and the copy is refused.
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fin, open(target, "wb") as fout:
        shutil.copyfileobj(fin, fout)


def locate(root: Path, relpath: str) -> Path | None:
    """The folder ``D`` under ``root`` such that ``D / relpath`` is a file.

    The top level wins, then ``assignment/``, then the shallowest match
    anywhere (ties broken alphabetically, so the answer is deterministic).
    """
    for base in (root, root / "assignment"):
        if (base / relpath).is_file():
            return base
    parts = Path(relpath).parts
    matches = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        if parts[-1] in filenames:
            candidate = Path(dirpath)
            base = candidate.parents[len(parts) - 2] if len(parts) > 1 else candidate
            if (base / relpath).is_file() and base.is_relative_to(root):
                matches.append(base)
    if not matches:
        return None
    return min(matches, key=lambda p: (len(p.relative_to(root).parts), str(p)))
