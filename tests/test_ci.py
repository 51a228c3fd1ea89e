"""`make test` (what .ci/run runs) fails when a test fails and when no test ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def make_test(pytest_args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "test", f"PYTEST_ARGS={pytest_args}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_no_tests_collected_is_a_failure(tmp_path: Path) -> None:
    empty = tmp_path / "test_empty.py"
    empty.write_text("def helper():\n    pass\n")
    proc = make_test(f"{empty} -p no:cacheprovider")
    assert proc.returncode != 0
    assert "collected no tests" in proc.stderr


def test_a_failing_test_fails_the_run(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_fails():\n    assert 1 == 2\n")
    proc = make_test(f"{probe} -p no:cacheprovider")
    assert proc.returncode != 0
    assert "1 failed" in proc.stdout


def test_ci_script_runs_the_readme_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "make test" in script
    assert "make test" in (ROOT / "README.md").read_text()


def test_make_bench_runs_every_benchmark() -> None:
    proc = subprocess.run(["make", "-n", "bench"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for step in (
        "-m grader calibrate",
        "benchmarks/verdict_stability.py --runs 50",
        "benchmarks/reference_mbu.py --dtype float32",
        "benchmarks/grading_budget.py --half-cpu",
        "-m pytest -m slow",
    ):
        assert step in proc.stdout, step


def _ci_with_fake_make(tmp_path: Path, failing: str) -> tuple[int, list[str]]:
    """.ci/run with a ``make`` that records its targets and fails on ``failing``."""
    import os

    log = tmp_path / "targets"
    fake = tmp_path / "make"
    fake.write_text(f'#!/bin/sh\necho "$1" >> {log}\n[ "$1" != "{failing}" ]\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = subprocess.run([str(ROOT / ".ci" / "run")], env=env, capture_output=True, timeout=60)
    return proc.returncode, log.read_text().split() if log.exists() else []


def test_ci_stops_at_a_failing_suite_then_runs_the_mutant_and_slurm_tests(tmp_path: Path) -> None:
    import os
    import shutil

    code, targets = _ci_with_fake_make(tmp_path, failing="test")
    assert code != 0 and targets == ["test"]  # a failing suite fails CI at once
    (tmp_path / "targets").unlink()
    code, targets = _ci_with_fake_make(tmp_path, failing="mutant-tests")
    assert code != 0 and targets == ["test", "mutant-tests"]  # the mutation runs count too
    (tmp_path / "targets").unlink()
    code, targets = _ci_with_fake_make(tmp_path, failing="attack-tests")
    assert code != 0 and targets == ["test", "mutant-tests", "attack-tests"]
    (tmp_path / "targets").unlink()
    code, targets = _ci_with_fake_make(tmp_path, failing="slurm-tests")
    runs = ["test", "mutant-tests", "attack-tests"]
    if os.getuid() == 0 and shutil.which("apt-get"):
        assert code != 0 and targets == [*runs, "slurm-tests"]  # CI's case
    else:
        assert code == 0 and targets == runs  # said, not run


def test_the_mutation_runs_leave_make_test_for_a_target_of_their_own() -> None:
    """Every library mutant, correct variant and triaged survivor is collected by
    ``make mutant-tests`` (which CI runs) and by no ``make test``."""
    from tests.ta.test_mutants import MUTANTS, VARIANTS
    from tests.ta.test_mutation import KILLED

    files = ["tests/ta/test_mutants.py", "tests/ta/test_mutation.py"]

    def collected(marks: str) -> int:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marks, *files],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return sum("::" in line for line in proc.stdout.splitlines())

    assert collected("mutants") == len(MUTANTS) + len(VARIANTS) + len(KILLED)
    dry = subprocess.run(["make", "-n", "test", "mutant-tests"], cwd=ROOT, capture_output=True)
    quick = b'-m "not slow and not slurm and not mutants and not attacks and not isolation"'
    assert quick in dry.stdout
    assert b'-m pytest -m "mutants or isolation"' in dry.stdout
