"""The autograder and student zips: exact contents, nothing secret in the student's,
stale cases refused, and the autograder zip run as Gradescope would run it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader import build, regen
from grader.parts import PARTS
from grader.points import bonus_total, part_total
from grader.run_local import run_local
from tests.conftest import ASSIGNMENT, ROOT, SOLUTION

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
    assert "grader/worker/main.py" in files and "grader/checks/part3.py" in files
    for forbidden in ("tests/", "solution/", "assignment/", "__pycache__", "mutant_library"):
        assert not any(forbidden in f for f in files), forbidden
    assert not any(f.endswith((".pyc", "regen.py", "mutants.py", "build.py")) for f in files)
    committed = {
        p.relative_to(ROOT).as_posix() for p in (ROOT / "test_cases").rglob("*") if p.is_file()
    }
    assert committed == {f for f in files if f.startswith("test_cases/")}
    with zipfile.ZipFile(autograder_zip) as zf:
        for script in ("setup.sh", "run_autograder"):
            assert (zf.getinfo(script).external_attr >> 16) & 0o111, script
        requirements = zf.read("requirements.txt").decode()
    assert "torch" not in requirements  # installed first, from the CPU index, by setup.sh


def test_setup_installs_cpu_torch_and_creates_the_worker_user() -> None:
    setup = (ROOT / "grader" / "gradescope" / "setup.sh").read_text()
    assert "torch==2.13.0" in setup and "download.pytorch.org/whl/cpu" in setup
    assert "create_worker_user.sh kvgrader" in setup
    assert "chmod -R go-rwx ." in setup  # hidden cases readable by root only


def test_student_zip_has_no_secret(student_zip: Path) -> None:
    files = names(student_zip)
    assert all(f.startswith("kv-cache-assignment/") for f in files)
    for forbidden in ("hidden", "solution", "mutant_library", "manifest.json", "regen.py"):
        assert not any(forbidden in f for f in files), forbidden
    with zipfile.ZipFile(student_zip) as zf:
        contents = [zf.read(f) for f in files]
    # No file of the reference solution that differs from the skeleton's version.
    for path in SOLUTION.rglob("*.py"):
        skeleton = ASSIGNMENT / path.relative_to(SOLUTION)
        if not skeleton.is_file() or skeleton.read_bytes() != path.read_bytes():
            assert path.read_bytes() not in contents, path
    # No edit of the mutant library (they quote the solution's lines).
    from grader.mutants import load_mutants

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
    with pytest.raises(build.StaleCases, match=r"part2\.json"):
        build.build_autograder(out=tmp_path / "a.zip")
    assert not (tmp_path / "a.zip").exists()


def test_run_local_grades_like_gradescope(autograder_zip: Path) -> None:
    results, _ = run_local(submission=SOLUTION, zip_path=autograder_zip)
    assert results.score == TOTAL
    blank, _ = run_local(submission=ASSIGNMENT, zip_path=autograder_zip)
    assert blank.score == 0
    assert len(blank.tests) == len(results.tests)


@pytest.mark.skipif(os.geteuid() != 0, reason="the source tree is made root-only as root")
def test_run_local_makes_the_source_root_only(autograder_zip: Path) -> None:
    _, tree = run_local(submission=SOLUTION, zip_path=autograder_zip, keep=True)
    try:
        mode = (tree / "source" / "test_cases" / "hidden").stat().st_mode
        assert mode & 0o077 == 0
    finally:
        import shutil

        shutil.rmtree(tree.parent, ignore_errors=True)


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
    assert "2.2" in proc.stdout and "2.6" not in proc.stdout  # hidden checks left out
    assert "0 / " in proc.stdout


def test_selfcheck_feedback_equals_the_autograders(student_zip: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from grader.mutants import load_mutants
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
        assert local_out[number] == official.output(number), number
    assert mutant.diagnosis in local_out["2.4"]


def test_zip_requirements_are_the_projects_runtime_dependencies() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(project["dependencies"]) == sorted(build.STUDENT_REQUIREMENTS)
