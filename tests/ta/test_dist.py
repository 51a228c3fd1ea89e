"""The autograder and student zips: exact contents, nothing secret in the student's,
stale cases refused, and the autograder zip run as Gradescope would run it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader.core.points import bonus_total, part_total
from grader.core.registry import PARTS
from grader.core.results import validate_results
from grader.ta import dist as build
from grader.ta import freshness, regen
from grader.ta.run_local import IMAGE_VENV, run_local
from tests.conftest import ASSIGNMENT, ROOT, SOLUTION

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("build")

TOTAL = sum(part_total(p) + bonus_total(p) for p in PARTS)  # full marks and every bonus


@pytest.fixture(scope="session")
def autograder_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "autograder.zip"
    return build.build_autograder(out=out, check_cases=False)


@pytest.fixture(scope="session")
def student_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist") / "student.zip"
    return build.build_student(out=out, check_cases=False)


def names(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return zf.namelist()


def test_autograder_zip_holds_exactly_what_grading_needs(autograder_zip: Path) -> None:
    files = names(autograder_zip)
    assert {"setup.sh", "run_autograder", "requirements.txt"} <= set(files)
    assert "test_cases/hidden/part2.json" in files and "test_cases/manifest.json" in files
    assert "grader/worker/main.py" in files and "grader/parts/part3/checks.py" in files
    for forbidden in ("tests/", "__pycache__", "grader/ta/"):
        assert not any(forbidden in f for f in files), forbidden
    # Of assignment/, only the files students need not edit: the grader supplies them to
    # an upload that lacks them. No skeleton.
    given = {f for f in files if f.startswith("assignment/")}
    assert given == {f"assignment/{rel}" for part in PARTS.values() for rel in part.given}
    assert "assignment/llama/tokenizer.py" in given
    # The reference of each benchmark part, the yardstick of its timed runs; nothing else
    # of solution/ (Part 1's answers, the course's scripts).
    reference = {f for f in files if f.startswith("solution/")}
    assert {"solution/transformer_skeleton.py", "solution/kv_lab.py"} <= reference
    assert "solution/llama/generation.py" in reference and "solution/llama/model.py" in reference
    assert not reference & {"solution/question1.py", "solution/inference.py"}
    ta_only = (".pyc", "regen.py", "mutants.py", "build.py", "skeleton.py")
    assert not any(f.endswith(ta_only) for f in files if f.startswith("grader/"))
    committed = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "test_cases").rglob("*") if p.is_file()
    }
    assert committed == {f for f in files if f.startswith("test_cases/")}
    with zipfile.ZipFile(autograder_zip) as zf:
        for script in ("setup.sh", "run_autograder"):
            assert (zf.getinfo(script).external_attr >> 16) & 0o111, script
        requirements = zf.read("requirements.txt").decode()
    pins = [line for line in requirements.splitlines() if line and line[0].isalnum()]
    assert pins and all("==" in line for line in pins)  # every package at an exact version
    assert "torch==2.13.0+cpu" in pins


def test_both_zips_hold_the_grading_path_of_the_package(
    autograder_zip: Path, student_zip: Path
) -> None:
    """grader/ in each zip is what a grading imports (and its data), computed from the
    imports: the TA's tooling, the CLI and the parts' case builders stay out."""
    wanted = {p.relative_to(ROOT).as_posix() for p in build.grading_files()}
    top = "kv-cache-assignment/"
    student = {f.removeprefix(top) for f in names(student_zip)}
    for files in (set(names(autograder_zip)), student):
        shipped = {f for f in files if f.startswith("grader/")}
        assert shipped - {f for f in shipped if f.startswith("grader/gradescope/")} == wanted
    assert "grader/grading/__main__.py" in wanted and "grader/core/thresholds.toml" in wanted
    assert "grader/parts/part4/adapter.py" in wanted and "grader/worker/values.py" in wanted
    left_out = ("grader/cli/", "grader/__main__.py", "grader/ta/", "/build.py", "build_pools")
    assert not [f for f in wanted if any(x in f for x in left_out)]


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the locked third-party packages and no grader: the
    dev venv's site-packages joins its path through a .pth line, which (unlike a site
    folder) does not run the .pth hooks there, so the project's editable install stays out."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    import numpy

    (site / "dev-packages.pth").write_text(str(Path(numpy.__file__).parent.parent) + "\n")
    return venv / "bin" / "python"


IMPORT_EVERY_MODULE = """
import importlib, pathlib, pkgutil, sys, tempfile
import grader
root = pathlib.Path(grader.__file__).parent
assert root.parent == pathlib.Path.cwd(), grader.__file__
names = [m.name for m in pkgutil.walk_packages([str(root)], "grader.")]
for name in names:
    if name.startswith("grader.worker.") or name.endswith(".adapter"):
        continue  # the worker side runs flat in the sandbox: imported below as it is run there
    importlib.import_module(name)
from grader.sandbox.sandbox import copy_worker_scripts
flat = pathlib.Path(tempfile.mkdtemp()) / "worker"
copy_worker_scripts(flat)  # as the sandbox holds them: the adapters renamed beside the worker's
sys.path.insert(0, str(flat))
for path in sorted(flat.glob("*.py")):
    if path.stem != "__init__":
        importlib.import_module(path.stem)
try:
    import grader.ta
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("grader.ta is importable: the zip's grader is not the one imported")
print(len(names))
"""


@pytest.mark.parametrize("which", ["autograder", "student"])
def test_every_module_of_the_zip_imports_in_a_fresh_venv(
    which: str, autograder_zip: Path, student_zip: Path, fresh_python: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(autograder_zip if which == "autograder" else student_zip) as zf:
        zf.extractall(tmp_path)
    home = tmp_path / ("kv-cache-assignment" if which == "student" else "")
    proc = subprocess.run(
        [str(fresh_python), "-E", "-s", "-c", IMPORT_EVERY_MODULE],
        cwd=home,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) == len(
        [f for f in build.grading_modules() if f != "grader"]
    )


def test_setup_builds_the_image_python_from_the_lock() -> None:
    setup = (ROOT / "grader" / "gradescope" / "setup.sh").read_text()
    assert "apt-get install" in setup and "python3.11 python3.11-venv" in setup
    assert "download.pytorch.org/whl/cpu" in setup  # torch from the CPU index only
    assert 'install --quiet -r "$lock"' in setup and 'pip[@]}" check' in setup
    assert 'create_worker_user.sh" kvgrader' in setup
    assert 'chmod -R go-rwx "$source_dir"' in setup  # hidden cases readable by root only


def test_setup_refuses_a_python_other_than_the_locks(tmp_path: Path, autograder_zip: Path) -> None:
    from grader.ta.run_local import unpack

    source = unpack(autograder_zip, tmp_path / "autograder")
    proc = subprocess.run(
        ["bash", str(source / "setup.sh"), "--no-system"],
        env={
            "PATH": "/usr/bin:/bin",
            "KVGRADER_BASE_PYTHON": "/bin/false",
            "KVGRADER_VENV": str(tmp_path / "venv"),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "not a Python 3.11" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_run_autograder_copy_still_writes_results_when_the_image_is_broken(
    tmp_path: Path, autograder_zip: Path
) -> None:
    """Run from Gradescope's place (a copy in ROOT) with no virtual environment."""
    from grader.ta.run_local import unpack

    tree = tmp_path / "autograder"
    source = unpack(autograder_zip, tree)
    shutil.copy2(source / "run_autograder", tree / "run_autograder")
    (tree / "submission").mkdir()
    subprocess.run(
        [str(tree / "run_autograder")],
        cwd=tree,
        env={"PATH": "/usr/bin:/bin", "KVGRADER_VENV": str(tmp_path / "missing")},
        timeout=60,
        check=True,
    )
    data = json.loads((tree / "results" / "results.json").read_text())
    validate_results(data)
    assert data["score"] == 0 and "could not start" in data["output"]


def test_student_zip_has_no_secret(student_zip: Path) -> None:
    files = names(student_zip)
    assert all(f.startswith("kv-cache-assignment/") for f in files)
    for forbidden in ("hidden", "solution", "grader/ta/", "manifest.json", "regen.py"):
        assert not any(forbidden in f for f in files), forbidden
    with zipfile.ZipFile(student_zip) as zf:
        contents = [zf.read(f) for f in files]
    # No file of the reference solution that differs from the skeleton's version.
    for path in SOLUTION.rglob("*.py"):
        skeleton = ASSIGNMENT / path.relative_to(SOLUTION)
        if not skeleton.is_file() or skeleton.read_bytes() != path.read_bytes():
            assert path.read_bytes() not in contents, path
    # No edit of the mutant library (they quote the solution's lines).
    from grader.ta.mutants import load_mutants

    blob = b"\n".join(contents)
    leaked = [
        m.name
        for p in PARTS
        for m in load_mutants(p)
        for old, _ in m.edits
        if old.encode() in blob and old not in (ASSIGNMENT / m.file).read_text()
    ]
    assert leaked == []


def test_student_zip_has_the_handout_skeletons_and_public_data(student_zip: Path) -> None:
    files = set(names(student_zip))
    top = "kv-cache-assignment/"
    for rel in (
        "README.md",
        "selfcheck.py",
        "assignment/question1.py",
        "assignment/transformer_skeleton.py",
        "assignment/llama/model.py",
        "test_cases/public/part2/model_state_dict.pt",
        "test_cases/public/part3/tiny_llama/params.json",
    ):
        assert top + rel in files, rel


def test_builds_are_deterministic(tmp_path: Path) -> None:
    a = build.build_student(out=tmp_path / "a.zip", check_cases=False)
    b = build.build_student(out=tmp_path / "b.zip", check_cases=False)
    assert a.read_bytes() == b.read_bytes()


def test_stale_cases_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(regen, "check", lambda: ["public/part2.json: differs"])
    monkeypatch.setattr(freshness, "CHECK_RECORD", tmp_path / "never-checked.json")
    with pytest.raises(build.StaleCases, match=r"part2\.json"):
        build.build_autograder(out=tmp_path / "a.zip")
    assert not (tmp_path / "a.zip").exists()


@pytest.fixture(scope="session")
def image_venv(autograder_zip: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's virtual environment, as the zip's setup.sh builds it for run-local."""
    from grader.ta.run_local import bare_environment, build_image, unpack

    source = unpack(autograder_zip, tmp_path_factory.mktemp("image") / "autograder")
    build_image(source, bare_environment(IMAGE_VENV))
    return IMAGE_VENV


def test_run_local_grades_like_gradescope(autograder_zip: Path, image_venv: Path) -> None:
    """The zip in Gradescope's layout (``run_autograder`` copied to ROOT and run from
    there, the image's own virtual environment): full marks, and zero for the blank."""
    results, tree = run_local(submission=SOLUTION, zip_path=autograder_zip, keep=True)
    try:
        lost = [(t.number, t.score, t.output[:600]) for t in results.tests if t.score < t.max_score]
        assert results.score == TOTAL, lost
        assert (tree / "run_autograder").is_file()  # Gradescope's copy was the one run
        warnings = results.extra_data["sandbox_warnings"]
        assert not [w for w in warnings if "fork server" in w]  # its workers were forked
        if os.geteuid() == 0:  # hidden cases readable by root only
            assert (tree / "source" / "test_cases" / "hidden").stat().st_mode & 0o077 == 0
    finally:
        shutil.rmtree(tree.parent, ignore_errors=True)
    blank, _ = run_local(submission=ASSIGNMENT, zip_path=autograder_zip)
    assert blank.score == 0
    assert {t.number for t in blank.tests} == {t.number for t in results.tests}


def test_run_local_grades_the_edited_files_uploaded_flat(
    autograder_zip: Path, image_venv: Path, tmp_path: Path
) -> None:
    """The two Part 3 files a student edits, uploaded flat and alone: Gradescope's tree
    supplies the rest of ``llama/`` and grades them at full marks; the parts not uploaded
    are named as such, once."""
    upload = tmp_path / "upload"
    upload.mkdir()
    for rel in PARTS["part3"].edited:
        shutil.copy(SOLUTION / rel, upload / Path(rel).name)
    results, _ = run_local(submission=upload, zip_path=autograder_zip)
    assert results.by_part()["part3"] == (part_total("part3"), part_total("part3"))
    assert "Supplied from the assignment" in results.output
    assert "llama/tokenizer.py" in results.output
    assert results.output.count("question1.py is not in your submission") == 1
    assert results.extra_data["files"]["part3"]["missing"] == []


def test_the_image_environment_is_only_what_setup_installs(image_venv: Path) -> None:
    """run-local's interpreter is setup.sh's, from the lock: no project install in it."""
    python = image_venv / "bin" / "python"
    lock = (ROOT / "requirements" / "image.txt").read_text()
    assert (image_venv / ".kvgrader-lock").read_text().strip() == sha256(lock.encode())
    probe = subprocess.run(
        [str(python), "-c", "import grader"], cwd="/", capture_output=True, timeout=60
    )
    assert probe.returncode != 0  # the grader is only reachable from ROOT/source
    freeze = subprocess.run(
        [str(python), "-m", "pip", "freeze"], capture_output=True, text=True, timeout=120
    ).stdout
    assert "kv-cache-course-kit" not in freeze and "torch==2.13.0+cpu" in freeze


def test_selfcheck_runs_the_public_checks_with_the_autograders_messages(
    student_zip: Path, tmp_path: Path
) -> None:
    with zipfile.ZipFile(student_zip) as zf:
        zf.extractall(tmp_path)
    home = tmp_path / "kv-cache-assignment"
    proc = subprocess.run(
        [sys.executable, "selfcheck.py", "assignment", "--parts", "part2"],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "FAIL  2.2 " in proc.stdout and "  2.6 " not in proc.stdout.split("TOTAL")[0]
    assert "0 / " in proc.stdout
    assert "2.6   <- 2.2" in proc.stdout  # the hidden check and its public counterpart
    assert "3.4 " not in proc.stdout  # only the parts asked for


def test_selfcheck_feedback_equals_the_autograders(student_zip: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from grader.core.feedback import escape
    from grader.ta.mutants import load_mutants
    from tests.conftest import run_grade

    with zipfile.ZipFile(student_zip) as zf:
        zf.extractall(tmp_path / "unzipped")
    home = tmp_path / "unzipped" / "kv-cache-assignment"
    mutant = next(m for m in load_mutants("part2") if m.name == "mask_not_offset")
    root = mutant.materialise()
    try:
        shutil.copy(root / mutant.file, home / "assignment" / mutant.file)
        official = run_grade(root, tmp_path / "official", parts=["part2"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    subprocess.run(
        [sys.executable, "selfcheck.py", "assignment", "--parts", "part2"],
        cwd=home,
        capture_output=True,
        timeout=600,
        check=True,
    )
    local = json.loads((home / "selfcheck_results.json").read_text())
    local_out = {t["number"]: t.get("output", "") for t in local["tests"]}
    for number in ("2.2", "2.4", "2.5"):
        assert local_out[number] == official.shown(number), number
    assert escape(mutant.diagnosis) in local_out["2.4"]


def test_zip_requirements_are_the_lock_and_the_students_the_locked_dependencies(
    autograder_zip: Path, student_zip: Path
) -> None:
    """The student installs every dependency at the autograder's version (the handout
    promises it), torch's CPU build coming from PyTorch's index as the handout says."""
    import tomllib

    with zipfile.ZipFile(autograder_zip) as zf:
        assert zf.read("requirements.txt") == (ROOT / "requirements" / "image.txt").read_bytes()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    with zipfile.ZipFile(student_zip) as zf:
        listed = zf.read("kv-cache-assignment/requirements.txt").decode().split("\n")
    pins = [line for line in listed if line and not line.startswith("#")]
    assert len(pins) == len(project["dependencies"])
    lock = (ROOT / "requirements" / "image.txt").read_text().splitlines()
    for pin in pins:
        assert re.fullmatch(r"[a-z0-9-]+==[0-9][\w.]*", pin), pin  # exact, no range
        assert any(line == pin or line.startswith(pin + "+") for line in lock), pin
    assert "numpy==" + build.locked_versions("\n".join(lock))["numpy"] in pins
    assert "torch==2.13.0" in pins  # satisfied by the CPU wheel installed just before


def test_student_requirements_pin_every_dependency_to_the_lock() -> None:
    text = build.student_requirements()
    assert ">=" not in text and "numpy>=1.26" not in text
    assert build.locked_versions("torch==2.13.0+cpu\nPyYAML==6.0.3\n    # via x\n") == {
        "torch": "2.13.0",
        "pyyaml": "6.0.3",
    }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
