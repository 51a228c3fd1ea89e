"""``python -m grader similarity EXPORT``: which submissions share code, as a lead for a TA.

The students' Python files are compared pairwise by copydetect (winnowed fingerprints of
the token stream with names normalised, as MOSS does), file against the file of the same
name in every other submission (an assignment file by the path the grader gives it, so a
``model.py`` uploaded flat is compared with ``llama/model.py``), with the kit's skeleton
(``assignment/``) given as boilerplate so that the starter code everyone received does not
count. The students' code is read, never run: only regular ``.py`` files under a size
limit are copied into a scratch tree first (links are not followed, and a submission folder
that is a link is skipped with a warning: :mod:`grader.ta.regrade.export`), and copydetect
tokenises that copy.

Output: ``similarity.csv`` and ``similarity.md`` (submission pairs ranked by their most
similar file, each pair with its students' names from the export's metadata, as
``scores.csv`` has them, and every file the two share), ``similarity_by_submission.csv``
(each submission's highest score) and ``similarity.html``: the ranked pairs first, then
each listed pair's files side by side with the matching regions highlighted. Every name and
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
from grader.core.registry import PARTS
from grader.sandbox.layout import part_files
from grader.ta.regrade.batch import parse_metadata
from grader.ta.regrade.export import METADATA, ExportError, find_export, submission_folders
from grader.ta.regrade.outputs import natural_key, safe_cell
from grader.ta.similarity_html import Code, report_html

#: Files larger than this are not compared (generated data, not a student's code).
MAX_FILE_BYTES = 512 * 1024
#: The code compared of one submission: copydetect holds every file's fingerprints and a
#: matrix over every pair of files, so an upload of thousands of files (a library copied
#: in) would take the comparison's memory. Its assignment files come first; what is past
#: either bound is left out, with a warning.
MAX_SUBMISSION_FILES = 64
MAX_SUBMISSION_BYTES = 4 * 2**20
#: Pairs listed in similarity.md (every pair is in the CSV).
TOP_PAIRS = 30
#: Tokens in a matching run below which copydetect ignores it (its noise threshold); runs
#: this long or longer are always found (its guarantee threshold).
NOISE_T, GUARANTEE_T = 25, 30


@dataclass(frozen=True)
class SharedFile:
    """One file two submissions both hold, and how alike their two copies are."""

    name: str  # its path in the submission (``llama/model.py``)
    score: float  # the mean of both directions' shares, 0..1
    first_share: float  # the share of the first submission's copy found in the second's
    second_share: float


@dataclass(frozen=True)
class Pair:
    """Two submissions and how alike their most similar file is (``files``: every file
    both hold, most similar first)."""

    first: str
    second: str
    score: float  # the mean of both directions' similarity of the file below, 0..1
    file: str  # the file name that scored it
    first_share: float  # the share of ``first``'s file found in ``second``'s
    second_share: float
    files: tuple[SharedFile, ...] = ()


@dataclass(frozen=True)
class Staged:
    """A submission's file as copied for copydetect: whose it is, and its own path."""

    folder: str
    rel: str


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


def assignment_names(folder: Path) -> dict[str, str]:
    """The files of a submission that the grader takes as the assignment's, each by its path
    in the assignment: ``model.py`` uploaded flat and ``assignment/llama/model.py`` are both
    ``llama/model.py``. Found by the rule the grader lays out an upload with
    (:func:`grader.sandbox.layout.part_files`)."""
    names: dict[str, str] = {}
    for part in PARTS.values():
        for rel, path in part_files(folder, part)[1].items():
            names.setdefault(path.relative_to(folder).as_posix(), rel)
    return names


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


def stage(
    folders: list[Path], scratch: Path, skeleton: dict[str, bytes | None]
) -> dict[str, Staged]:
    """Copy every submission's code files under ``scratch/<folder>/``, each file flattened
    to one name (``llama/model.py`` -> ``llama__model.py``) so that copydetect pairs files
    by name across submissions; an assignment file goes by its path in the assignment
    (:func:`assignment_names`), wherever it was uploaded. A file byte for byte the
    skeleton's (``skeleton``: path -> content) holds nothing of the student's and is left
    out. Returns staged path -> its submission and the file's name there."""
    owner: dict[str, Staged] = {}
    for folder in folders:
        names = assignment_names(folder)
        files = sorted(code_files(folder).items(), key=lambda item: item[0] not in names)
        staged = size = left = 0
        for rel, path in files:
            name = names.get(rel, rel)
            code = read_code(path)
            dest = scratch / folder.name / name.replace("/", "__")
            if code is None or skeleton.get(name) == code or str(dest) in owner:
                continue
            if staged >= MAX_SUBMISSION_FILES or size + len(code) > MAX_SUBMISSION_BYTES:
                left += 1
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(code)
            owner[str(dest)] = Staged(folder.name, name)
            staged, size = staged + 1, size + len(code)
        if left:
            print(f"warning: {folder.name}: {left} code files not compared (past "
                  f"{MAX_SUBMISSION_FILES} files or {MAX_SUBMISSION_BYTES // 2**20} MiB)",
                  file=sys.stderr)  # fmt: skip
    return owner


def ranked_pairs(files: list[str], matrix: np.ndarray, owner: dict[str, Staged]) -> list[Pair]:
    """Every pair of submissions that share a compared file, ranked by their most similar
    one, with every file they share (``matrix[i, j] = (share of i found in j, share of j
    found in i)``, -1 where not compared)."""
    shared: dict[tuple[str, str], list[SharedFile]] = {}
    compared = np.triu(np.all(matrix >= 0, axis=2), k=1)
    for i, j in zip(*np.nonzero(compared), strict=True):
        a, b = owner.get(files[i]), owner.get(files[j])
        if a is None or b is None or a.folder == b.folder:
            continue
        (first, s1), (second, s2) = sorted(
            [(a.folder, float(matrix[i, j, 0])), (b.folder, float(matrix[i, j, 1]))],
            key=lambda x: natural_key(x[0]),
        )
        shared.setdefault((first, second), []).append(SharedFile(a.rel, (s1 + s2) / 2, s1, s2))
    pairs = []
    for (first, second), found in shared.items():
        found.sort(key=lambda f: (-f.score, f.name))
        top = found[0]
        pairs.append(
            Pair(first, second, top.score, top.name, top.first_share, top.second_share,
                 tuple(found))
        )  # fmt: skip
    return sorted(pairs, key=lambda p: (-p.score, natural_key(p.first), natural_key(p.second)))


def highest(pairs: list[Pair], folders: list[str]) -> dict[str, float]:
    """Each submission's highest pair score (0 for one with no code beyond the skeleton)."""
    best = dict.fromkeys(folders, 0.0)
    for p in pairs:
        for folder in (p.first, p.second):
            best[folder] = max(best.get(folder, 0.0), p.score)
    return best


def names_of(export_dir: Path) -> dict[str, str]:
    """Each submission folder's students, as ``scores.csv`` names them (``"Ada; Grace"``),
    from the export's metadata; empty where it has none."""
    path = export_dir / METADATA
    if not path.is_file():
        return {}
    people = parse_metadata(path.read_text())
    return {folder: "; ".join(p.name for p in found if p.name) for folder, found in people.items()}


def label(folder: str, names: dict[str, str]) -> str:
    """A submission as a TA recognises it: its students, then its folder."""
    return f"{names[folder]} ({folder})" if names.get(folder) else folder


def files_text(pair: Pair) -> str:
    """Every file a pair shares with its score, most similar first."""
    return "; ".join(f"{f.name} {f.score:.2f}" for f in pair.files)


def write_outputs(
    pairs: list[Pair],
    out_dir: Path,
    folders: list[str],
    names: dict[str, str] | None = None,
    without_code: list[str] | None = None,
) -> None:
    """``similarity.csv`` (every pair), ``similarity.md`` (the top pairs, and how to read
    them; the names in its table are escaped for Markdown, as a student chose them; the
    submissions in no pair, ``without_code``, named under it) and
    ``similarity_by_submission.csv``."""
    names = names or {}
    with open(out_dir / "similarity.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["rank", "first", "second", "first_names", "second_names", "score",
                         "file", "first_share", "second_share", "files"])  # fmt: skip
        for rank, p in enumerate(pairs, 1):
            people = [safe_cell(names.get(x, "")) for x in (p.first, p.second)]
            writer.writerow([rank, p.first, p.second, *people, f"{p.score:.3f}", p.file,
                             f"{p.first_share:.3f}", f"{p.second_share:.3f}",
                             files_text(p)])  # fmt: skip
    lines = [
        "# Code similarity", "",
        f"{len(folders)} submissions compared, file against the file of the same name (an "
        "assignment file wherever it was uploaded, flat or in folders), with the skeleton's "
        "code as boilerplate. A score is the share of a file's fingerprints "
        "found in the other's (both directions averaged); a pair is ranked by its most "
        "similar file, and every file it shares is listed. A high rank is a reason to read "
        "the two submissions side by side in `similarity.html`, never a verdict: short "
        "files, the course's own hints and the handout's formulas make honest work alike.",
        "", "| rank | first | second | score | shared files |", "| --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    lines += [f"| {r} | {escape(label(p.first, names))} | {escape(label(p.second, names))} | "
              f"{p.score:.2f} | {escape(files_text(p))} |"
              for r, p in enumerate(pairs[:TOP_PAIRS], 1)]  # fmt: skip
    if without_code:
        who = "; ".join(escape(label(f, names)) for f in without_code)
        lines += ["", f"In no pair ({len(without_code)}): {who}. Every file they uploaded is "
                  "the skeleton's, byte for byte: nothing of theirs to compare."]  # fmt: skip
    (out_dir / "similarity.md").write_text("\n".join(lines) + "\n")
    with open(out_dir / "similarity_by_submission.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", "names", "highest_score"])
        for folder, score in highest(pairs, folders).items():
            writer.writerow([folder, safe_cell(names.get(folder, "")), f"{score:.3f}"])


def export_of(export_dir: Path) -> Path:
    """The export to compare: where :func:`~grader.ta.regrade.export.find_export` finds its
    metadata, else the folder itself (every subfolder a submission, with a warning)."""
    export_dir = Path(export_dir).resolve()
    if not export_dir.is_dir():
        raise FileNotFoundError(f"{export_dir} is not a folder")
    try:
        return find_export(export_dir).resolve()
    except ExportError:
        print(f"warning: {export_dir} has no {METADATA}; every subfolder is a submission",
              file=sys.stderr)  # fmt: skip
        return export_dir


def main(*, export_dir: Path, out_dir: Path, boilerplate: Path = ASSIGNMENT) -> list[Pair]:
    """Compare the submissions of ``export_dir`` and write the ranked pairs and the
    highlighted report into ``out_dir``; return the pairs, most similar first."""
    import matplotlib

    matplotlib.use("Agg")  # copydetect imports pyplot

    export_dir, out_dir = export_of(export_dir), Path(out_dir).resolve()
    folders = submissions_of(export_dir, skip=out_dir)
    names = names_of(export_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="similarity-") as tmp:
        scratch = Path(tmp)
        skeleton = {rel: read_code(path) for rel, path in code_files(boilerplate).items()}
        owner = stage(folders, scratch / "submissions", skeleton)
        stage([boilerplate], scratch / "boilerplate", {})
        # Relative paths: copydetect names "submissions/submission_1/question1.py".
        with contextlib.chdir(scratch):
            pairs, code = compare({os.path.relpath(k, scratch): v for k, v in owner.items()})
    staged = {s.folder for s in owner.values()}
    alone = [f.name for f in folders if f.name not in staged]
    write_outputs(pairs, out_dir, [f.name for f in folders], names, alone)
    page = report_html(pairs[:TOP_PAIRS], code, names, submissions=len(folders),
                       total=len(pairs), without_code=alone)  # fmt: skip
    (out_dir / "similarity.html").write_text(page, encoding="utf-8")
    return pairs


def compare(owner: dict[str, Staged]) -> tuple[list[Pair], dict[tuple[str, str, str], Code]]:
    """copydetect over ``submissions/`` against ``boilerplate/`` (in the working folder):
    the ranked pairs, and the highlighted code of each file pair copydetect shows (above
    its display threshold), by (first, second, file) with the first submission's first."""
    from copydetect import CopyDetector

    detector = CopyDetector(
        test_dirs=["submissions"],
        boilerplate_dirs=["boilerplate"],
        extensions=["py"],
        noise_t=NOISE_T,
        guarantee_t=GUARANTEE_T,
        same_name_only=True,
        truncate=True,  # a copy shows its matching regions with 10 lines around each
        autoopen=False,
        silent=True,
    )
    detector.run()
    files = [str(f) for f in detector.test_files]
    if not owner:
        return [], {}
    code: dict[tuple[str, str, str], Code] = {}
    for entry in detector.get_copied_code_list():
        a, b = owner.get(str(entry[2])), owner.get(str(entry[3]))
        if a is None or b is None or a.folder == b.folder:
            continue
        ends = [(a.folder, entry[4]), (b.folder, entry[5])]
        ends.sort(key=lambda x: natural_key(x[0]))
        code[(ends[0][0], ends[1][0], a.rel)] = Code(ends[0][1], ends[1][1])
    return ranked_pairs(files, detector.similarity_matrix, owner), code
