"""Building the two zips a course needs, and running the autograder zip locally.

* ``autograder.zip`` (upload to Gradescope): ``setup.sh`` and ``run_autograder`` at
  its root, the grader package, all test cases (hidden ones included) and a
  ``requirements.txt`` (the image's lock). No project tests, no solution, no caches.
* ``student.zip`` (hand out): the handout, the skeletons, the public test data
  and a self-check (``python selfcheck.py``) that runs the autograder's public
  checks with its messages. Nothing hidden, nothing from ``solution/``, and no
  mutant library (its edits quote the solution). Part 1's public cases are all
  write-up answers: they hold their values sealed (``grader/parts/part1/seal.py``),
  and a build refuses a public Part 1 case whose expected value is in plain form.

Both refuse stale test cases: ``regen --check`` must pass first. Zips are
deterministic (sorted entries, fixed timestamps), so a rebuild that changes
nothing gives the same bytes.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from grader.context import PROJECT_ROOT

GRADESCOPE = PROJECT_ROOT / "grader" / "gradescope"
FIXED_TIME = (2024, 1, 1, 0, 0, 0)
NEVER = ["__pycache__", "*.pyc", ".DS_Store", "*.png", "results", "benchmark_results.json"]
# Modules that generate cases from solution/ or quote it: graders need none of them.
TA_ONLY = [
    "regen.py",
    "mutants.py",
    "mutation*.py",
    "build.py",  # grader/build.py, and every part's case builder (grader/parts/*/build.py)
    "build_*.py",  # the builders' own modules (grader/parts/part3/build_pools.py)
    "mutants.toml",
    "skeleton.py",
]
#: Exact versions of every package of the image (``make lock``), for Python 3.11.
IMAGE_LOCK = PROJECT_ROOT / "requirements" / "image.txt"


class StaleCases(RuntimeError):
    """The committed test cases no longer match solution/ (run ``python -m grader regen``)."""


def _files(root: Path, skip: Iterable[str] = ()) -> Iterator[Path]:
    """Every file under ``root``, sorted, without the ``NEVER`` and ``skip`` patterns."""
    patterns = [*NEVER, *skip]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _matches(d, patterns))
        for name in sorted(filenames):
            if not _matches(name, patterns):
                yield Path(dirpath) / name


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _write(zf: zipfile.ZipFile, arcname: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(arcname, date_time=FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    mode = 0o755 if executable else 0o644
    info.external_attr = (stat.S_IFREG | mode) << 16
    zf.writestr(info, data)


def _add_tree(zf: zipfile.ZipFile, root: Path, prefix: str, skip: Iterable[str] = ()) -> None:
    for path in _files(root, skip):
        rel = path.relative_to(root).as_posix()
        executable = os.access(path, os.X_OK) and path.suffix in ("", ".sh")
        _write(zf, f"{prefix}{rel}", path.read_bytes(), executable)


def ensure_fresh_cases() -> None:
    from grader import regen

    problems = regen.check()
    if problems:
        raise StaleCases("stale test cases:\n  " + "\n  ".join(problems))


class PlainAnswers(RuntimeError):
    """A public Part 1 case holds its write-up answer in plain form (run ``regen``)."""


def plain_answers(public: Path) -> list[str]:
    """The public Part 1 cases under ``public`` that hold an expected value or a known
    mistake's value in plain form instead of sealed (the student zip ships these)."""
    path = public / "part1.json"
    if not path.is_file():
        return []
    cases = json.loads(path.read_text())["cases"]
    return [f"{c['check']} {c['label']}" for c in cases if "expected" in c or "mistakes" in c]


def requirements() -> str:
    """The autograder image's requirements: the lock, every package at an exact version."""
    return IMAGE_LOCK.read_text()


def student_requirements() -> str:
    """The student's requirements: the project's dependencies as ranges (any platform)."""
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    return "\n".join(project["dependencies"]) + "\n"


def build_autograder(*, out: Path, check_cases: bool = True) -> Path:
    """Write the Gradescope autograder zip to ``out``."""
    if check_cases:
        ensure_fresh_cases()
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w") as zf:
        _write(zf, "setup.sh", (GRADESCOPE / "setup.sh").read_bytes(), executable=True)
        _write(zf, "run_autograder", (GRADESCOPE / "run_autograder").read_bytes(), True)
        _write(zf, "requirements.txt", requirements().encode())
        _add_tree(zf, PROJECT_ROOT / "grader", "grader/", skip=TA_ONLY)
        _add_tree(zf, PROJECT_ROOT / "test_cases", "test_cases/")
    return out


def build_student(*, out: Path, check_cases: bool = True) -> Path:
    """Write the student handout zip to ``out`` (one top folder, the repository's layout)."""
    if check_cases:
        ensure_fresh_cases()
    plain = plain_answers(PROJECT_ROOT / "test_cases" / "public")
    if plain:
        raise PlainAnswers("public Part 1 cases with plain answers: " + "; ".join(plain))
    top = "kv-cache-assignment/"
    out.parent.mkdir(parents=True, exist_ok=True)
    student = GRADESCOPE / "student"
    with zipfile.ZipFile(out, "w") as zf:
        _write(zf, f"{top}README.md", (PROJECT_ROOT / "assignment" / "README.md").read_bytes())
        _write(zf, f"{top}selfcheck.py", (student / "selfcheck.py").read_bytes(), True)
        _write(zf, f"{top}requirements.txt", student_requirements().encode())
        _add_tree(zf, PROJECT_ROOT / "assignment", f"{top}assignment/", skip=["README.md"])
        _add_tree(zf, PROJECT_ROOT / "test_cases" / "public", f"{top}test_cases/public/")
        _add_tree(zf, PROJECT_ROOT / "grader", f"{top}grader/", skip=[*TA_ONLY, "gradescope"])
    return out
