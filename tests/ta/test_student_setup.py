"""The student's side, as a student meets it: ``student.zip`` unpacked, the handout's
set-up commands run verbatim in a fresh virtual environment, and the self-check run on
the blank skeletons (0, every check listed) and on the reference with one Part 2 mistake
(full marks elsewhere, a report with pictures).

Only pip's own configuration is used. ``PIP_RETRIES=0`` keeps an unreachable PyTorch
index (a machine without a network) from costing retries: pip then falls back to its
configured local wheels, as it would to the index on a student's machine.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock
from PIL import Image

from grader.core.points import BONUS, POINTS, bonus_total, part_total
from grader.core.registry import PARTS
from grader.ta import dist as build
from grader.ta.mutants import load_mutants
from grader.ta.regen import import_path
from tests.conftest import ROOT, SOLUTION

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("student_setup")

TOP = "kv-cache-assignment"


def setup_commands(handout: str) -> list[str]:
    """The command lines of the handout's set-up block (the first block after "## Set-up")."""
    section = handout.split("\n## Set-up\n", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None, "the set-up section has no command block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_handout_opens_with_the_set_up() -> None:
    handout = (ROOT / "assignment" / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", handout, re.M)
    assert headings[0] == "Set-up"
    commands = setup_commands(handout)
    assert commands[0].startswith("python3.11 -m venv")
    assert "download.pytorch.org/whl/cpu" in commands[2]
    assert commands[3].endswith("install -r requirements.txt")
    assert commands[-1] == "python selfcheck.py"


def test_selfcheck_lists_a_public_counterpart_for_every_hidden_check() -> None:
    """Each check tagged hidden (cases only Gradescope has) maps to public checks that the
    self-check runs; every other check runs in the self-check itself."""
    from grader.grading.runner import build_suite

    def numbers(public_only: bool) -> set[str]:
        suite = build_suite(None, list(PARTS), public_only=public_only)  # type: ignore[arg-type]
        return {getattr(type(t), t._testMethodName).__number__ for t in suite}

    selfcheck = import_path(ROOT / "grader/gradescope/student/selfcheck.py", "selfcheck_test")
    every, public = numbers(False), numbers(True)
    assert every == {n for part in POINTS.values() for n in part} | set(BONUS)
    assert set(selfcheck.HIDDEN_COUNTERPARTS) == every - public
    for hidden, counterparts in selfcheck.HIDDEN_COUNTERPARTS.items():
        assert counterparts and set(counterparts) <= public, hidden
        assert all(c.split(".")[0] == hidden.split(".")[0] for c in counterparts), hidden
    assert {"4.2", "4.3", "4.4"} <= public  # Part 4's prompts now have public cases


def test_selfcheck_started_on_windows_says_to_use_wsl(monkeypatch, capsys) -> None:
    """The sandbox needs Linux or macOS (fcntl, pwd, resource): on Windows the self-check
    stops at once with what to do, not with a ModuleNotFoundError."""
    selfcheck = import_path(ROOT / "grader/gradescope/student/selfcheck.py", "selfcheck_nt")
    monkeypatch.setattr(selfcheck.os, "name", "nt")
    monkeypatch.setattr(selfcheck.subprocess, "call", lambda *a, **k: pytest.fail("graded"))
    assert selfcheck.main([]) == 2
    err = capsys.readouterr().err
    assert "WSL" in err and "Linux or macOS" in err
    assert "python3 -m venv" not in err  # not the venv advice: the platform is the cause


def test_selfcheck_explains_a_missing_set_up(tmp_path: Path) -> None:
    """Run with an interpreter that lacks the packages: the set-up commands, no traceback."""
    script = ROOT / "grader" / "gradescope" / "student" / "selfcheck.py"
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(script)],  # no site-packages: nothing installed
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "lacks torch" in proc.stderr and "pip install -r requirements.txt" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_set_up_hint_is_the_handouts_set_up() -> None:
    """A student without the set-up is told the handout's lines (python3.11, not python3)."""
    handout = (ROOT / "assignment" / "README.md").read_text()
    selfcheck = import_path(ROOT / "grader/gradescope/student/selfcheck.py", "selfcheck_hint")
    assert tuple(setup_commands(handout)[:-1]) == selfcheck.SETUP_COMMANDS
    assert "python3.11 -m venv .venv" in selfcheck.SETUP_HINT
    assert "python3 -m venv" not in selfcheck.SETUP_HINT


def test_the_handout_says_what_the_grader_folder_is() -> None:
    handout = " ".join((ROOT / "assignment" / "README.md").read_text().split())
    said = "the zip holds `grader/`, the autograder's own checking code that `selfcheck.py`"
    assert said in handout and "(you never edit or import it)" in handout


def test_selfcheck_run_from_inside_assignment_grades_the_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cd assignment; python ../selfcheck.py``, as the handout has students work there:
    the assignment beside the script is graded (not ``assignment/assignment``)."""
    home = tmp_path / TOP
    (home / "assignment").mkdir(parents=True)
    shutil.copy(ROOT / "grader/gradescope/student/selfcheck.py", home / "selfcheck.py")
    selfcheck = import_path(home / "selfcheck.py", "selfcheck_inside")
    graded: list[list[str]] = []
    monkeypatch.setattr(selfcheck, "setup_problem", lambda: "")
    monkeypatch.setattr(selfcheck.subprocess, "call", lambda cmd, **kw: graded.append(cmd) or 0)
    for where, argv in ((home / "assignment", []), (home, []), (home / "assignment", ["."])):
        monkeypatch.chdir(where)
        assert selfcheck.main([*argv, "--parts", "1"]) == 0
    assert [cmd[4] for cmd in graded] == [str(home / "assignment")] * 3


def student_venv_key(commands: list[str], requirements: str) -> str:
    """What the handout's set-up installs depends on: its commands, the requirements file
    they name, the interpreter and the machine."""
    inputs = [*commands, requirements, sys.version, platform.platform(), platform.machine()]
    return hashlib.sha256("\n".join(inputs).encode()).hexdigest()


def student_env() -> dict[str, str]:
    """This process's environment without its venv and Python settings: a student's shell."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}


def install(home: Path, commands: list[str]) -> None:
    """Run the set-up ``commands`` in ``home`` as a student's shell would."""
    env = {**student_env(), "PIP_RETRIES": "0", "PIP_NO_INPUT": "1"}
    proc = subprocess.run(
        ["bash", "-euc", "\n".join(commands)],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def student_home(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """student.zip unpacked and set up by the handout's commands, in a fresh venv.

    The installed venv is kept in pytest's cache (at a fixed path: a venv records where it
    lives) under the key of what it was installed from; a warm run of the suite with the
    same commands, requirements and interpreter puts this build's files around it instead
    of installing again. ``KVGRADER_FRESH_VENV=1`` or ``pytest --cache-clear`` installs."""
    base = tmp_path_factory.mktemp("student")
    zip_path = build.build_student(out=base / "student.zip", check_cases=False)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(base)
    unpacked = base / TOP
    commands = setup_commands((unpacked / "README.md").read_text())[:-1]  # the last: selfcheck
    key = student_venv_key(commands, (unpacked / "requirements.txt").read_text())
    kept = request.config.cache.mkdir("student-venv")
    home, complete = kept / TOP, kept / "complete"
    with FileLock(f"{kept}.lock"):
        reuse = complete.is_file() and complete.read_text().strip() == key
        if not reuse or os.environ.get("KVGRADER_FRESH_VENV") == "1":
            complete.unlink(missing_ok=True)
            shutil.rmtree(home, ignore_errors=True)
            shutil.copytree(unpacked, home)
            install(home, commands)
            complete.write_text(key + "\n")  # written last: a venv cut short is never reused
        else:  # this build's files, none of the last run's, around the kept venv
            for child in home.iterdir():
                if child.name != ".venv":
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            shutil.copytree(unpacked, home, dirs_exist_ok=True)
    assert (home / ".venv" / "bin" / "python").is_file()
    return home


def test_the_kept_venv_follows_what_it_was_installed_from() -> None:
    """Another command, requirement or interpreter is another key: the venv is installed
    again rather than reused."""
    commands = setup_commands((ROOT / "assignment" / "README.md").read_text())[:-1]
    key = student_venv_key(commands, "torch\n")
    assert student_venv_key(commands, "torch\n") == key
    assert student_venv_key(commands, "torch\nnumpy\n") != key
    assert student_venv_key([*commands[:-1], "pip install other"], "torch\n") != key


def run_selfcheck(home: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``python selfcheck.py ARGS`` with the student's environment active."""
    command = f". .venv/bin/activate && python selfcheck.py {' '.join(args)}"
    env = student_env()
    proc = subprocess.run(
        ["bash", "-euc", command], cwd=home, env=env, capture_output=True, text=True, timeout=900
    )
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr[-3000:]
    return proc, json.loads((home / "selfcheck_results.json").read_text())


def test_fresh_venv_selfcheck_blank_then_reference(student_home: Path) -> None:
    """One test (the install is the expensive part): the blank skeletons score 0 with
    every public check listed; the reference with one Part 2 mistake planted scores every
    public point of Parts 1, 3 and 4 and the bonus, and its HTML report holds the three
    pictures (Part 4's latency, Part 3's speedups, Part 2's logit errors)."""
    proc, blank = run_selfcheck(student_home)
    listed = {t["number"] for t in blank["tests"]}
    selfcheck = import_path(student_home / "selfcheck.py", "selfcheck_student_home")
    every = {n for part in POINTS.values() for n in part} | set(BONUS)
    assert listed == every - set(selfcheck.HIDDEN_COUNTERPARTS)
    assert blank["score"] == 0
    for number in listed:
        assert re.search(rf"FAIL  {re.escape(number)} ", proc.stdout), number
    assert "TOTAL  0 / " in proc.stdout
    assert "public counterparts here" in proc.stdout

    mistake = next(m for m in load_mutants("part2") if m.name == "positions_not_offset")
    reference = student_home / "reference"
    shutil.copytree(SOLUTION, reference, ignore=shutil.ignore_patterns("__pycache__"))
    target = reference / mistake.file
    target.write_text(mistake.apply(target.read_text()))
    proc, full = run_selfcheck(student_home, "reference")
    failed = {t["number"] for t in full["tests"] if t["status"] != "passed"}
    assert failed and all(n.startswith("2.") for n in failed), proc.stdout[-4000:]
    assert "2.4" in failed and "report with pictures" in proc.stdout
    hidden_points = sum(POINTS[f"part{n.split('.')[0]}"][n] for n in selfcheck.HIDDEN_COUNTERPARTS)
    total = sum(part_total(p) + bonus_total(p) for p in PARTS)
    lost = sum(t["max_score"] - t["score"] for t in full["tests"] if t["number"] in failed)
    assert full["score"] == pytest.approx(total - hidden_points - lost)
    page = (student_home / "selfcheck_report.html").read_text()
    found = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page)
    assert [alt for alt, _ in found] == [
        "Part 2: per-position logit error", "Part 3: speedup per batch size",
        "Part 4: latency against L",
    ]  # fmt: skip
    for _, data in found:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        assert image.format == "PNG" and image.size == (576, 360)
    assert "The reference's curves:" in page


def selfcheck_module():
    return import_path(ROOT / "grader/gradescope/student/selfcheck.py", "selfcheck_args")


@pytest.mark.parametrize(
    ("argv", "folder", "options"),
    [
        ([], "assignment", ["--device", "cpu"]),
        (["mine", "--parts", "4"], "mine", ["--parts", "part4", "--device", "cpu"]),
        (["--parts=2,part3"], "assignment", ["--parts", "part2,part3", "--device", "cpu"]),
        (["mine", "--device", "cuda"], "mine", ["--device", "cuda"]),
    ],
)
def test_selfcheck_reads_parts_by_number_or_tag(argv, folder, options) -> None:
    """Parts by number or tag; the device is Gradescope's (cpu) unless the student asks
    for the GPU benchmarks, also on a machine with a GPU."""
    got_folder, got_options, _, error = selfcheck_module().student_arguments(argv)
    assert (got_folder, got_options, error) == (folder, options, "")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--parts", "5"], "the parts are 1, 2, 3 and 4"),
        (["--parts"], "--parts needs a value"),
        (["--tags", "benchmark"], "unknown argument '--tags'"),
        (["a", "b"], "unknown argument 'b'"),
    ],
)
def test_selfcheck_answers_a_wrong_argument_with_its_own_usage(argv, said, capsys) -> None:
    selfcheck = selfcheck_module()
    assert selfcheck.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "usage: python selfcheck.py" in err
    assert "regrade" not in err and "batch" not in err  # not the TA subcommands


def test_selfcheck_says_which_points_only_gradescope_checks(tmp_path: Path) -> None:
    selfcheck = selfcheck_module()
    results = tmp_path / "selfcheck_results.json"
    ran = [n for n in POINTS["part1"] if n not in ("1.12", "1.13")]
    results.write_text(json.dumps({"tests": [{"number": n} for n in ran]}))
    note = selfcheck.points_note(results, ["part1"])
    assert note == "16 of 20 points are checked here; 4 only on Gradescope: 1.12, 1.13."
    assert selfcheck.points_note(results, ["part4"]).startswith("All 20 points")
    assert selfcheck.counterpart_note(["part4"]) == ""  # no empty header
    assert "1.12  <- 1.1" in selfcheck.counterpart_note(["part1"])


def test_selfcheck_says_which_timed_checks_gradescope_also_compares(tmp_path: Path) -> None:
    """A timed check whose answers only Gradescope compares on hidden prompts is named in
    the note, for the parts run; the handout says the same."""
    selfcheck = selfcheck_module()
    results = tmp_path / "selfcheck_results.json"
    ran = [n for part in ("part2", "part4") for n in POINTS[part] if n not in ("2.6", "2.7")]
    results.write_text(json.dumps({"tests": [{"number": n} for n in ran]}))
    note = selfcheck.points_note(results, ["part2"])
    assert note.endswith(
        "On Gradescope, 2.9, 2.11 also compare your timed runs' answers with the reference's "
        "on hidden prompts."
    )
    assert "hidden prompts" not in selfcheck.points_note(results, ["part4"])
    handout = (ROOT / "assignment" / "README.md").read_text()
    listed = ", ".join(selfcheck.ANSWERS_COMPARED_ON_GRADESCOPE[:-1])
    assert f"{listed} and {selfcheck.ANSWERS_COMPARED_ON_GRADESCOPE[-1]}" in " ".join(
        handout.split()
    )
    for number in selfcheck.ANSWERS_COMPARED_ON_GRADESCOPE:  # Parts whose timed runs say so
        part = f"part{number.split('.')[0]}"
        assert number in POINTS[part]
        assert "HIDDEN_ANSWER" in (ROOT / "grader" / "parts" / part / "timed.py").read_text()
