"""The command line: exit status 0 whenever results were written; clear errors otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ASSIGNMENT, ROOT, SOLUTION


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "grader", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_grade_prints_a_table_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run("grade", str(SOLUTION), "--results", str(out), "--table", "--parts", "part1")
    assert proc.returncode == 0, proc.stderr
    assert "TOTAL  20 / 20" in proc.stdout
    assert json.loads(out.read_text())["score"] == 20


def test_a_table_with_failed_checks_says_how_to_read_their_feedback(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run("grade", str(tmp_path), "--results", str(out), "--table", "--parts", "part3")
    assert proc.returncode == 0, proc.stderr
    top, table = proc.stdout.split("\n\n", 1)
    assert "llama/model.py is not in your submission" in top  # the page's own first lines
    python = Path(sys.executable)  # the grader's own interpreter, as the TA can type it
    typed = python.relative_to(ROOT) if python.is_relative_to(ROOT) else python
    assert f"11 check(s) failed: `{typed} -m grader show {out}` prints" in table
    details = run("grade", str(tmp_path), "--results", str(out), "--table", "--details",
                  "--parts", "part3")  # fmt: skip
    assert "grader show" not in details.stdout  # the feedback is printed already


def test_zero_score_still_exits_zero(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run("grade", str(ASSIGNMENT), "--results", str(out), "--parts", "part1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["score"] == 0


def test_a_folder_that_does_not_exist_is_an_error_not_a_zero(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    for command in (["grader"], ["grader.grading"]):  # the TA's CLI and the zips' entry point
        proc = subprocess.run(
            [sys.executable, "-m", *command, "grade", str(tmp_path / "typo"), "--results",
             str(out)], cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        assert proc.returncode == 2
        assert f"{tmp_path / 'typo'} is not a folder" in proc.stderr
        assert not out.exists()


def test_unknown_part_is_a_usage_error(tmp_path: Path) -> None:
    proc = run("grade", str(SOLUTION), "--results", str(tmp_path / "r.json"), "--parts", "part9")
    assert proc.returncode == 2
    assert "unknown part(s) part9" in proc.stderr


def test_regen_check_passes_on_committed_cases() -> None:
    """The command's wiring, on Part 1 alone (tests/test_regen.py regenerates every part)."""
    proc = run("regen", "--check", "--parts", "part1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


def test_regen_refuses_an_unknown_part_before_writing() -> None:
    proc = run("regen", "--parts", "part9")
    assert proc.returncode == 2
    assert "unknown part(s) part9" in proc.stderr


def test_grade_only_the_benchmark_checks(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = run("grade", str(SOLUTION), "--results", str(out), "--parts", "part4",
               "--tags", "benchmark", "--device", "cpu")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [t["number"] for t in data["tests"]] == ["4.6"]
    assert data["extra_data"]["benchmarks"]["4.6"]["profile"] == "cpu"


def test_calibrating_parts_without_benchmarks_is_a_usage_error() -> None:
    proc = run("calibrate", "--parts", "part1", "--runs", "1")
    assert proc.returncode == 2
    assert "no benchmark checks in these parts" in proc.stderr


def test_show_reprints_a_stored_result_as_grade_prints_it(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    graded = run("grade", str(ASSIGNMENT), "--results", str(out), "--parts", "part1",
                 "--table", "--details")  # fmt: skip
    shown = run("show", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "TOTAL  0 / 20" in shown.stdout and "not implemented yet" in shown.stdout
    table = graded.stdout.split("results written to")[0].strip()
    assert shown.stdout.strip() == table
    only = run("show", str(out), "--no-details")
    assert "not implemented yet" not in only.stdout and "TOTAL  0 / 20" in only.stdout


def test_show_refuses_a_file_that_is_not_a_results_file(tmp_path: Path) -> None:
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps({"tests": 3}))
    proc = run("show", str(bad))
    assert proc.returncode == 2
    assert "is not a readable results file" in proc.stderr and "schema" not in proc.stderr


def test_help_opens_with_what_the_tool_does_and_hides_the_internal_command() -> None:
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    opening = proc.stdout.split("\n\n")[1]
    assert opening.startswith("Grade the KV-cache assignment as Gradescope does"), opening
    assert "keyword-only" not in proc.stdout and "thin subcommands" not in proc.stdout
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("    ")]
    assert "grade" in listed and "batch" in listed and "gradescope" not in listed
    assert run("gradescope", "--help").returncode == 0  # run_autograder's command still works


def test_version() -> None:
    from importlib.metadata import version

    proc = run("--version")
    assert (
        proc.returncode == 0 and proc.stdout.strip() == f"kvgrader {version('kv-cache-course-kit')}"
    )
