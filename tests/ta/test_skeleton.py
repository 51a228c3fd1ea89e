"""assignment/ is generated from the annotated solution/ (grader/ta/skeleton.py): the
committed skeletons are what the markers give, provided code exists once, a malformed
marker names its file and line, and ``regen --check`` catches a hand-edited skeleton.

That the generated skeleton scores 0 with every check present is graded once, by the
session's ``blank_graded`` fixture (tests/conftest.py), which grades a freshly
generated copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader import cli
from grader.core.points import BONUS, POINTS
from grader.ta import regen, skeleton
from grader.ta.skeleton import MarkerError, strip_solution
from tests.conftest import ASSIGNMENT, SOLUTION

#: Provided code: no marker, so the student's copy is the solution's, byte for byte.
PROVIDED = {
    "benchmark_inference.py",
    "inference.py",
    "llama/__init__.py",
    "llama/tokenizer.py",
}


def committed_files() -> set[str]:
    return {p.relative_to(ASSIGNMENT).as_posix() for p in skeleton.source_files(ASSIGNMENT)}


def test_committed_assignment_is_what_the_solution_generates() -> None:
    assert skeleton.check() == []
    assert committed_files() == set(skeleton.generate()) | set(skeleton.STUDENT_ONLY)


def test_provided_code_exists_once_and_every_todo_file_is_stripped() -> None:
    generated = skeleton.generate()
    same = {rel for rel, data in generated.items() if data == (SOLUTION / rel).read_bytes()}
    assert same == PROVIDED
    for rel, data in generated.items():
        text = data.decode()
        assert "BEGIN SOLUTION" not in text and "BEGIN PROMPT" not in text, rel
        compile(text, rel, "exec")
        if rel not in PROVIDED:
            assert "raise NotImplementedError" in text, rel


def test_the_markers_as_the_readme_describes_them() -> None:
    text = (
        "def f(x: int) -> int:\n"
        '    """Kept in both."""\n'
        "    # BEGIN SOLUTION\n"
        "    return x + 1\n"
        "    # END SOLUTION\n"
        "    # BEGIN PROMPT\n"
        "    # # TODO: add one.\n"
        "    #\n"
        "    # raise NotImplementedError('f')\n"
        "    # END PROMPT\n"
        "\n"
        "# BEGIN SOLUTION\n"
        "HELPER = 1\n"
        "# END SOLUTION\n"
        "x = 2  # kept\n"
    )
    assert strip_solution(text) == (
        "def f(x: int) -> int:\n"
        '    """Kept in both."""\n'
        "    # TODO: add one.\n"
        "\n"
        "    raise NotImplementedError('f')\n"
        "\n"
        "x = 2  # kept\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = 1\n# BEGIN SOLUTION\nb = 2\n", "q.py:2: BEGIN SOLUTION is never closed"),
        (
            "# BEGIN SOLUTION\nb = 2\n    # BEGIN PROMPT\n",
            "q.py:3: BEGIN PROMPT inside the SOLUTION region opened at line 1",
        ),
        ("a = 1\n\n    # END SOLUTION\n", "q.py:3: END SOLUTION without a BEGIN SOLUTION"),
        (
            "# BEGIN SOLUTION\nb = 2\n# END PROMPT\n",
            "q.py:3: END PROMPT closes the SOLUTION region opened at line 1",
        ),
        ("# BEGIN PROMPT\nraise X\n# END PROMPT\n", "q.py:2: a prompt line must be a comment"),
        ("x = 1\n#BEGIN  solution\n", "q.py:2: malformed marker"),
    ],
    ids=["unclosed", "nested", "end-without-begin", "mismatched-end", "prompt-code", "misspelt"],
)
def test_a_marker_error_names_file_and_line(text: str, message: str) -> None:
    with pytest.raises(MarkerError) as raised:
        strip_solution(text, "q.py")
    assert str(raised.value).startswith(message)


def broken_solution(tmp_path: Path) -> tuple[Path, str]:
    """A copy of solution/ whose question1.py lost its first END SOLUTION, and the error
    that must name it: the next BEGIN opens inside the region still open."""
    solution = tmp_path / "solution"
    shutil.copytree(SOLUTION, solution, ignore=skeleton_ignore)
    path = solution / "question1.py"
    lines = path.read_text().splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.strip() == "# BEGIN SOLUTION")
    end = next(i for i, line in enumerate(lines) if line.strip() == "# END SOLUTION")
    del lines[end]
    path.write_text("".join(lines))
    nested = next(i for i in range(end, len(lines)) if lines[i].strip().startswith("# BEGIN"))
    return solution, (
        f"solution/question1.py:{nested + 1}: BEGIN PROMPT inside the SOLUTION region "
        f"opened at line {begin + 1}"
    )


def skeleton_ignore(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith(".png")]


def test_a_broken_solution_file_is_named_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    solution, message = broken_solution(tmp_path)
    with pytest.raises(MarkerError) as raised:
        skeleton.generate(solution)
    assert str(raised.value).startswith(message)
    out = tmp_path / "out"
    monkeypatch.setattr(skeleton, "SOLUTION", solution)
    assert cli.main(["build", "skeleton", "--out", str(out)]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()
    (problem,) = skeleton.check(ASSIGNMENT, solution)
    assert problem.startswith(f"cannot generate the skeletons: {message}")


def test_build_skeleton_writes_the_committed_files(tmp_path: Path) -> None:
    out = tmp_path / "assignment"
    assert cli.main(["build", "skeleton", "--out", str(out)]) == 0
    for rel in skeleton.generate():
        assert (out / rel).read_bytes() == (ASSIGNMENT / rel).read_bytes(), rel
    assert skeleton.write(out) == []  # a second build changes nothing


def test_the_generated_skeleton_imports(tmp_path: Path) -> None:
    skeleton.write(tmp_path)
    modules = [
        "question1",
        "transformer_skeleton",
        "llama.model",
        "llama.generation",
        "llama.tokenizer",
        "inference",
        "benchmark_inference",
        "kv_lab",
    ]
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_generated_skeleton_scores_zero_with_every_check_present(blank_graded) -> None:
    numbers = [t["number"] for t in blank_graded.data["tests"]]
    every_check = {n for checks in POINTS.values() for n in checks} | set(BONUS)
    assert len(numbers) == len(set(numbers)) and set(numbers) == every_check
    assert blank_graded.data["score"] == 0


def edited_assignment(tmp_path: Path) -> Path:
    """A copy of assignment/ with one line of kv_lab.py edited by hand, one file added and
    one removed."""
    copy = tmp_path / "assignment"
    shutil.copytree(ASSIGNMENT, copy, ignore=skeleton_ignore)
    path = copy / "kv_lab.py"
    lines = path.read_text().splitlines(keepends=True)
    lines[40] = lines[40].rstrip("\n") + "  # edited by hand\n"
    path.write_text("".join(lines))
    (copy / "notes.py").write_text("x = 1\n")
    (copy / "inference.py").unlink()
    return copy


def test_a_hand_edited_skeleton_is_stale(tmp_path: Path) -> None:
    problems = skeleton.check(edited_assignment(tmp_path))
    assert problems == [
        "assignment/inference.py: missing (generated from solution/inference.py)",
        "assignment/kv_lab.py: differs from what solution/kv_lab.py generates (from line 41)",
        "assignment/notes.py: not generated from solution/ and not a student-only file "
        "(grader/ta/skeleton.py, STUDENT_ONLY)",
    ]


def test_regen_check_fails_on_a_hand_edited_skeleton(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case files are taken as they are committed (their own check is tests/test_regen.py)."""
    monkeypatch.setattr(skeleton, "ASSIGNMENT", edited_assignment(tmp_path))
    monkeypatch.setattr(
        regen, "write_cases", lambda out, solution=SOLUTION: shutil.copytree(
            regen.TEST_CASES, out, dirs_exist_ok=True
        )
    )  # fmt: skip
    assert cli.main(["regen", "--check"]) == 1
    out = capsys.readouterr().out
    assert "stale: assignment/kv_lab.py: differs from what solution/kv_lab.py generates" in out
    assert "stale: assignment/notes.py: not generated" in out
    assert "run `python -m grader regen`" in out
