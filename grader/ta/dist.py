"""Building the two zips a course needs, and running the autograder zip locally.

* ``autograder.zip`` (upload to Gradescope): ``setup.sh`` and ``run_autograder`` at
  its root, the grader package, all test cases (hidden ones included) and a
  ``requirements.txt`` (the image's lock), and the reference solution's files of the
  parts with a benchmark check (the yardstick their timed runs are judged against,
  closed to the worker like the hidden cases). No project tests, no caches.
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
import io
import json
import os
import re
import stat
import sys
import tomllib
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grimp

from grader.core.paths import (
    ASSIGNMENT,
    DIST_PATTERNS,
    GRADESCOPE_FILES,
    PACKAGE,
    PROJECT_ROOT,
    REQUIREMENTS,
    SOLUTION,
    TEST_CASES,
)
from grader.core.registry import PARTS
from grader.grading.selfcheck_page import REFERENCE_FILE
from grader.sandbox.forkserver import SERVER_MODULE
from grader.ta.freshness import StaleCases, Step, ensure_fresh_cases  # noqa: F401 (the CLI's)

FIXED_TIME = (2024, 1, 1, 0, 0, 0)
#: Where a grading starts: the zips' entry point (``python -m grader.grading``, run by
#: ``run_autograder`` and ``selfcheck.py``) and the check modules the runner loads by name.
#: The worker's scripts and the parts' adapters are copied into the sandbox as files.
GRADING_ENTRY = "grader.grading.__main__"
#: Exact versions of every package of the image (``make lock``), for Python 3.11.
IMAGE_LOCK = REQUIREMENTS / "image.txt"


def _files(root: Path, skip: Iterable[str] = ()) -> Iterator[Path]:
    """Every file under ``root``, sorted, without the ``DIST_PATTERNS`` and ``skip`` ones."""
    patterns = [*DIST_PATTERNS, *skip]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _matches(d, patterns))
        for name in sorted(filenames):
            if not _matches(name, patterns):
                yield Path(dirpath) / name


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _module_file(module: str) -> Path:
    path = PACKAGE.parent / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def grading_modules() -> list[str]:
    """Every grader module a grading can import: the import closure (import-linter's graph,
    imports inside functions included) of the entry point, the parts' check modules, the
    worker side and the fork server (run as ``-m``), with the packages that hold them."""
    graph = grimp.build_graph("grader", cache_dir=None)
    worker_side = {m for m in graph.modules if m.startswith("grader.worker")}
    worker_side |= {f"grader.parts.{p}.adapter" for p in PARTS}
    todo = [GRADING_ENTRY, SERVER_MODULE, *(p.checks_module for p in PARTS.values()), *worker_side]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.find_modules_directly_imported_by(module)
    packages = {".".join(m.split(".")[:i]) for m in seen for i in range(1, m.count(".") + 1)}
    return sorted(seen | packages)


def grading_files() -> list[Path]:
    """The files of :func:`grading_modules` and the data beside them: every other file in
    a folder that holds one of them, and in that folder's data subfolders (``schemas/``).
    The top ``grader/`` folder contributes its ``__init__.py`` only."""
    files = {_module_file(m) for m in grading_modules()}
    for folder in {f.parent for f in files} - {PACKAGE}:
        for path in _files(folder):
            package_dirs = [p for p in path.relative_to(folder).parents if p != Path(".")]
            inside_package = any((folder / d / "__init__.py").is_file() for d in package_dirs)
            if path.suffix != ".py" and not inside_package:
                files.add(path)
    return sorted(files)


def _add_files(zf: zipfile.ZipFile, paths: Iterable[Path], base: Path, prefix: str) -> None:
    """``paths`` under ``prefix``, named relative to ``base``; scripts stay executable."""
    for path in paths:
        rel = path.relative_to(base).as_posix()
        executable = os.access(path, os.X_OK) and path.suffix in ("", ".sh")
        _write(zf, f"{prefix}{rel}", path.read_bytes(), executable)


def _add_grader(zf: zipfile.ZipFile, prefix: str) -> None:
    """The grading path of ``grader/`` (:func:`grading_files`) under ``prefix``."""
    _add_files(zf, grading_files(), PACKAGE.parent, prefix)


def _write(zf: zipfile.ZipFile, arcname: str, data: bytes, executable: bool = False) -> None:
    info = zipfile.ZipInfo(arcname, date_time=FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    mode = 0o755 if executable else 0o644
    info.external_attr = (stat.S_IFREG | mode) << 16
    zf.writestr(info, data)


def _add_tree(zf: zipfile.ZipFile, root: Path, prefix: str, skip: Iterable[str] = ()) -> None:
    """Every file under ``root`` (but the ``skip`` patterns) under ``prefix``."""
    _add_files(zf, _files(root, skip), root, prefix)


class PlainAnswers(RuntimeError):
    """A public Part 1 case holds its write-up answer in plain form (run ``regen``)."""


def plain_answers(public: Path) -> list[str]:
    """The public Part 1 cases under ``public`` that hold a write-up answer or a known
    mistake's value in plain form instead of sealed (the student zip ships these). Cases
    on inputs of their own (``own_input``) may show their answers."""
    path = public / "part1.json"
    if not path.is_file():
        return []
    cases = json.loads(path.read_text())["cases"]
    return [
        f"{c['check']} {c['label']}"
        for c in cases
        if ("expected" in c or "mistakes" in c) and not c.get("own_input")
    ]


def requirements() -> str:
    """The autograder image's requirements: the lock, every package at an exact version."""
    return IMAGE_LOCK.read_text()


def _package(requirement: str) -> str:
    """A requirement's package name, normalised as pip compares them (``PyYAML>=6`` ->
    ``pyyaml``)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    return re.sub(r"[-_.]+", "-", name.group(0)).lower() if name else ""


def locked_versions(lock: str) -> dict[str, str]:
    """Package -> exact version of a lock (``torch==2.13.0+cpu`` -> ``2.13.0``: the local
    build tag names the CPU wheel, which the handout installs from PyTorch's index)."""
    found = {}
    for line in lock.splitlines():
        if "==" in line and line[:1].isalnum():
            name, _, version = line.partition("==")
            found[_package(name)] = version.split(";")[0].strip().split("+")[0]
    return found


STUDENT_REQUIREMENTS_HEAD = (
    "# The autograder's versions (its image's lock) of the packages the assignment uses.\n"
    "# Install torch first, from PyTorch's CPU index (README.md, 'Set-up'), then this file.\n"
)


def student_requirements() -> str:
    """The student's requirements: each of the project's dependencies at the version the
    autograder's image runs (its lock), so that a student's results match Gradescope's;
    only the direct dependencies, so that pip resolves the rest for the student's platform."""
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    locked = locked_versions(IMAGE_LOCK.read_text())
    pins = [f"{_package(d)}=={locked[_package(d)]}" for d in project["dependencies"]]
    return STUDENT_REQUIREMENTS_HEAD + "\n".join(pins) + "\n"


def reference_files() -> list[Path]:
    """The reference solution's files a grading runs: each benchmark part's main file, or
    the whole folder that holds it (Part 3's ``llama/`` package)."""
    from grader.ta.calibrate import BENCHMARK_PARTS

    tops = {Path(PARTS[p].main_file).parts[0] for p in BENCHMARK_PARTS}
    found = []
    for top in sorted(tops):
        path = SOLUTION / top
        found += list(_files(path)) if path.is_dir() else [path]
    return found


def given_files() -> list[Path]:
    """The assignment's files a student need not edit (every part's ``given``): the
    grader supplies them where an upload lacks them (:mod:`grader.sandbox.layout`)."""
    return sorted({ASSIGNMENT / rel for part in PARTS.values() for rel in part.given})


def build_autograder(*, out: Path, check_cases: bool = True, reuse: bool = False) -> Path:
    """Write the Gradescope autograder zip to ``out``. With ``reuse``, a zip already at
    ``out`` with exactly the bytes a build would write is kept, and said to be (builds
    are deterministic, so this is "up to date")."""
    if check_cases:
        ensure_fresh_cases()
    kept = reuse and out.is_file()
    with Step(f"{'checking' if kept else 'building'} {out}", file=sys.stdout):
        data = _zip_bytes(_autograder_entries)
    if kept and out.read_bytes() == data:
        print(f"{out}: up to date, reused ({len(data) / 2**20:.1f} MiB)", flush=True)
        return out
    if kept:
        print(f"{out}: out of date, written again", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return out


def _zip_bytes(entries: Callable[[zipfile.ZipFile], None]) -> bytes:
    """The bytes of a zip that ``entries`` fills."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        entries(zf)
    return buffer.getvalue()


def _autograder_entries(zf: zipfile.ZipFile) -> None:
    """Every entry of the autograder zip."""
    _write(zf, "setup.sh", (GRADESCOPE_FILES / "setup.sh").read_bytes(), executable=True)
    _write(zf, "run_autograder", (GRADESCOPE_FILES / "run_autograder").read_bytes(), True)
    _write(zf, "requirements.txt", requirements().encode())
    _add_grader(zf, "")
    _add_tree(zf, TEST_CASES, "test_cases/")
    _add_files(zf, reference_files(), SOLUTION, "solution/")
    _add_files(zf, given_files(), ASSIGNMENT, "assignment/")


def build_student(*, out: Path, check_cases: bool = True) -> Path:
    """Write the student handout zip to ``out`` (one top folder, the repository's layout)."""
    if check_cases:
        ensure_fresh_cases()
    plain = plain_answers(TEST_CASES / "public")
    if plain:
        raise PlainAnswers("public Part 1 cases with plain answers: " + "; ".join(plain))
    top = "kv-cache-assignment/"
    out.parent.mkdir(parents=True, exist_ok=True)
    student = GRADESCOPE_FILES / "student"
    with Step(f"building {out}", file=sys.stdout), zipfile.ZipFile(out, "w") as zf:
        _write(zf, f"{top}README.md", (ASSIGNMENT / "README.md").read_bytes())
        _write(zf, f"{top}selfcheck.py", (student / "selfcheck.py").read_bytes(), True)
        reference = student / REFERENCE_FILE  # the self-check report's reference curves
        _write(zf, f"{top}{reference.name}", reference.read_bytes())
        _write(zf, f"{top}requirements.txt", student_requirements().encode())
        _add_tree(zf, ASSIGNMENT, f"{top}assignment/", skip=["README.md"])
        _add_tree(zf, TEST_CASES / "public", f"{top}test_cases/public/")
        _add_grader(zf, top)
    return out
