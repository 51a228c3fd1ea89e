"""``python -m grader similarity EXPORT``: which submissions share code, as a lead for a TA.

The students' Python files are compared pairwise by copydetect (winnowed fingerprints of
the token stream with names normalised, as MOSS does), file against the file of the same
name in every other submission, with the kit's skeleton (``assignment/``) given as
boilerplate so that the starter code everyone received does not count. The students' code
is read, never run: only regular ``.py`` files under a size limit are copied into a scratch
tree first (links are not followed, and a submission folder that is a link is skipped with
a warning: :mod:`grader.ta.regrade.export`), and copydetect tokenises that copy.

Output: ``similarity.csv`` and ``similarity.md`` (submission pairs ranked by their most
similar file), ``similarity_by_submission.csv`` (each submission's highest score) and
copydetect's ``similarity.html`` with the matching regions highlighted. Every name and
line of code a student chose is escaped once in each page (:mod:`grader.ta.similarity_html`,
and :func:`grader.core.feedback.escape` in the Markdown).
A high rank is a reason to read two submissions side by side, never a verdict.
"""

from __future__ import annotations

import contextlib
import csv
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grader.core.feedback import escape
from grader.core.paths import ASSIGNMENT
from grader.ta.regrade.batch import METADATA
from grader.ta.regrade.export import submission_folders
from grader.ta.regrade.report import natural_key
from grader.ta.similarity_html import report_html

#: Files larger than this are not compared (generated data, not a student's code).
MAX_FILE_BYTES = 512 * 1024
#: Pairs listed in similarity.md (every pair is in the CSV).
TOP_PAIRS = 30
#: Tokens in a matching run below which copydetect ignores it (its noise threshold); runs
#: this long or longer are always found (its guarantee threshold).
NOISE_T, GUARANTEE_T = 25, 30


@dataclass(frozen=True)
class Pair:
    """Two submissions and how alike their most similar file is."""

    first: str
    second: str
    score: float  # the mean of both directions' similarity of the file below, 0..1
    file: str  # the file name that scored it
    first_share: float  # the share of ``first``'s file found in ``second``'s
    second_share: float


def code_files(folder: Path) -> dict[str, Path]:
    """The Python files of one submission, by path relative to it: regular files only
    (a link is never followed), under :data:`MAX_FILE_BYTES`, outside hidden folders."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder)
        if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        if any(p.is_symlink() for p in path.parents if folder in p.parents):
            continue
        found[rel.as_posix()] = path
    return found


def read_code(path: Path) -> bytes | None:
    """The bytes of ``path`` if, when opened, it is a regular file of at most
    :data:`MAX_FILE_BYTES` (a link is not followed, a FIFO does not block); else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        code = f.read(MAX_FILE_BYTES + 1)
    return code if len(code) <= MAX_FILE_BYTES else None


def submissions_of(export: Path, skip: Path | None = None) -> list[Path]:
    """The submission folders of an export (all subfolders but hidden ones and ``skip``),
    in order; one that is a link or resolves outside the export is skipped with a warning."""
    return submission_folders(export, skip=skip)[0]


def stage(folders: list[Path], scratch: Path, skeleton: dict[str, bytes | None]) -> dict[str, str]:
    """Copy every submission's code files under ``scratch/<folder>/``, each file flattened
    to one name (``llama/model.py`` -> ``llama__model.py``) so that copydetect pairs files
    by name across submissions. A file byte for byte the skeleton's (``skeleton``: path ->
    content) holds nothing of the student's and is left out. Returns staged path ->
    submission folder name."""
    owner = {}
    for folder in folders:
        for rel, path in code_files(folder).items():
            code = read_code(path)
            if code is None or skeleton.get(rel) == code:
                continue
            dest = scratch / folder.name / rel.replace("/", "__")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(code)
            owner[str(dest)] = folder.name
    return owner


def ranked_pairs(files: list[str], matrix: np.ndarray, owner: dict[str, str]) -> list[Pair]:
    """Every pair of submissions that share a compared file, ranked by their most similar
    one (``matrix[i, j] = (share of i found in j, share of j found in i)``, -1 where not
    compared)."""
    best: dict[tuple[str, str], Pair] = {}
    compared = np.triu(np.all(matrix >= 0, axis=2), k=1)
    for i, j in zip(*np.nonzero(compared), strict=True):
        a, b = owner.get(files[i]), owner.get(files[j])
        if a is None or b is None or a == b:
            continue
        (first, s1), (second, s2) = sorted(
            [(a, float(matrix[i, j, 0])), (b, float(matrix[i, j, 1]))],
            key=lambda x: natural_key(x[0]),
        )
        pair = Pair(first, second, (s1 + s2) / 2, Path(files[i]).name, s1, s2)
        if (first, second) not in best or pair.score > best[(first, second)].score:
            best[(first, second)] = pair
    return sorted(
        best.values(), key=lambda p: (-p.score, natural_key(p.first), natural_key(p.second))
    )


def highest(pairs: list[Pair], folders: list[str]) -> dict[str, float]:
    """Each submission's highest pair score (0 for one with no code beyond the skeleton)."""
    best = dict.fromkeys(folders, 0.0)
    for p in pairs:
        for folder in (p.first, p.second):
            best[folder] = max(best.get(folder, 0.0), p.score)
    return best


def write_outputs(pairs: list[Pair], out_dir: Path, folders: list[str]) -> None:
    """``similarity.csv`` (every pair) and ``similarity.md`` (the top pairs, and how to
    read them; the names in its table are escaped for Markdown, as a student chose them)."""
    with open(out_dir / "similarity.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["rank", "first", "second", "score", "file", "first_share", "second_share"])
        for rank, p in enumerate(pairs, 1):
            writer.writerow([rank, p.first, p.second, f"{p.score:.3f}", p.file,
                             f"{p.first_share:.3f}", f"{p.second_share:.3f}"])  # fmt: skip
    lines = [
        "# Code similarity", "",
        f"{len(folders)} submissions compared, file against the file of the same name, with the "
        "skeleton's code as boilerplate. A score is the share of a file's fingerprints "
        "found in the other's (both directions averaged). A high rank is a reason to read "
        "the two submissions side by side in `similarity.html`, never a verdict: short "
        "files, the course's own hints and the handout's formulas make honest work alike.",
        "", "| rank | first | second | score | file |", "| --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    lines += [f"| {r} | {escape(p.first)} | {escape(p.second)} | {p.score:.2f} | {escape(p.file)} |"
              for r, p in enumerate(pairs[:TOP_PAIRS], 1)]  # fmt: skip
    (out_dir / "similarity.md").write_text("\n".join(lines) + "\n")
    with open(out_dir / "similarity_by_submission.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", "highest_score"])
        for folder, score in highest(pairs, folders).items():
            writer.writerow([folder, f"{score:.3f}"])


def main(*, export_dir: Path, out_dir: Path, boilerplate: Path = ASSIGNMENT) -> list[Pair]:
    """Compare the submissions of ``export_dir`` and write the ranked pairs and the
    highlighted report into ``out_dir``; return the pairs, most similar first."""
    import matplotlib

    matplotlib.use("Agg")  # copydetect draws its figures with pyplot

    export_dir, out_dir = Path(export_dir).resolve(), Path(out_dir).resolve()
    if not export_dir.is_dir():
        raise FileNotFoundError(f"{export_dir} is not a folder")
    if not (export_dir / METADATA).exists():
        print(f"warning: {export_dir} has no {METADATA}; every subfolder is a submission",
              file=sys.stderr)  # fmt: skip
    folders = submissions_of(export_dir, skip=out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="similarity-") as tmp:
        scratch = Path(tmp)
        skeleton = {rel: read_code(path) for rel, path in code_files(boilerplate).items()}
        owner = stage(folders, scratch / "submissions", skeleton)
        stage([boilerplate], scratch / "boilerplate", {})
        # Relative paths: the report names "submissions/submission_1/question1.py".
        with contextlib.chdir(scratch):
            pairs = compare(out_dir, {os.path.relpath(k, scratch): v for k, v in owner.items()})
    write_outputs(pairs, out_dir, [f.name for f in folders])
    return pairs


def compare(out_dir: Path, owner: dict[str, str]) -> list[Pair]:
    """copydetect over ``submissions/`` against ``boilerplate/`` (in the working folder),
    its report written to ``out_dir``; the ranked pairs."""
    from copydetect import CopyDetector

    detector = CopyDetector(
        test_dirs=["submissions"],
        boilerplate_dirs=["boilerplate"],
        extensions=["py"],
        noise_t=NOISE_T,
        guarantee_t=GUARANTEE_T,
        same_name_only=True,
        autoopen=False,
        silent=True,
        out_file=str(out_dir / "similarity.html"),
    )
    detector.run()
    files = [str(f) for f in detector.test_files]
    pairs = ranked_pairs(files, detector.similarity_matrix, owner) if owner else []
    if pairs:  # copydetect's own writer leaves file names unescaped
        (out_dir / "similarity.html").write_text(report_html(detector), encoding="utf-8")
    return pairs
