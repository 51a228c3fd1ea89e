"""The TA's build commands: the cases checked once per content, each step said as it runs,
an up-to-date zip reused by run-local, and run-local saying where its results.json is."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from grader import cli
from grader.cli.kit import cmd_run_local
from grader.core.results import GradingResults
from grader.ta import dist, freshness, regen
from grader.ta import run_local as run_local_module


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """regen.check replaced by a counter that finds nothing; the record under tmp_path."""
    calls: list[int] = []
    monkeypatch.setattr(regen, "check", lambda **kw: calls.append(1) or [])
    monkeypatch.setattr(freshness, "CHECK_RECORD", tmp_path / "dist" / ".cases-checked.json")
    return calls


def test_the_cases_are_checked_once_per_content(
    checks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    said = io.StringIO()
    freshness.ensure_fresh_cases(file=said)
    freshness.ensure_fresh_cases(file=said)  # the other zip, or run-local after make dist
    assert len(checks) == 1
    lines = said.getvalue().splitlines()
    assert lines[0].startswith("checking the test cases against solution/")
    assert "done in" in lines[1] and lines[-1].startswith("test cases: up to date")
    monkeypatch.setattr(freshness, "content_digest", lambda: "another content")
    freshness.ensure_fresh_cases(file=said)
    assert len(checks) == 2  # a changed file of solution/ or a case builder: checked again


def test_stale_cases_are_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "record.json"
    monkeypatch.setattr(regen, "check", lambda: ["public/part2.json: differs"])
    for _ in range(2):  # refused each time: a failed check is never remembered
        with pytest.raises(freshness.StaleCases, match=r"part2\.json"):
            freshness.ensure_fresh_cases(file=io.StringIO(), record=record)
    assert not record.exists()


def test_the_digest_covers_solution_and_the_case_builders_only() -> None:
    inputs = {p.relative_to(freshness.PROJECT_ROOT).as_posix() for p in freshness._inputs()}
    assert "solution/question1.py" in inputs and "grader/parts/part2/cases.py" in inputs
    assert "test_cases/manifest.json" in inputs and "grader/ta/regen.py" in inputs
    assert "grader/ta/similarity.py" not in inputs  # TA tools that build no case
    assert not any("__pycache__" in p for p in inputs)
    assert freshness.content_digest() == freshness.content_digest()


def test_a_long_step_says_it_is_still_running() -> None:
    said = io.StringIO()
    with freshness.Step("waiting", every_s=0.05, file=said):
        import time

        time.sleep(0.2)
    lines = said.getvalue().splitlines()
    assert lines[0] == "waiting ..." and "s so far" in lines[1]
    assert lines[-1].startswith("waiting: done in ")


def test_an_up_to_date_autograder_zip_is_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "autograder.zip"
    dist.build_autograder(out=out, check_cases=False)
    before = out.stat().st_mtime_ns
    capsys.readouterr()  # the first build's lines
    assert dist.build_autograder(out=out, check_cases=False, reuse=True) == out
    assert out.stat().st_mtime_ns == before
    said = capsys.readouterr().out
    assert "up to date, reused" in said
    assert "building" not in said  # a reused zip was checked, not built
    out.write_bytes(b"an older build")
    dist.build_autograder(out=out, check_cases=False, reuse=True)
    assert out.read_bytes()[:2] == b"PK"  # stale: rebuilt
    assert "out of date, written again" in capsys.readouterr().out


def test_run_local_says_where_its_results_json_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_run_local(**kwargs: object) -> tuple[GradingResults, Path]:
        return GradingResults(tests=[]), tmp_path

    monkeypatch.setattr(run_local_module, "run_local", fake_run_local)
    args = cli.build_parser().parse_args(["run-local", "solution", "--zip", "x.zip"])
    assert cmd_run_local(args) == 0
    out = capsys.readouterr().out
    assert f"results.json: {run_local_module.KEPT_RESULTS}" in out


def test_run_local_keeps_a_copy_of_the_results(tmp_path: Path, monkeypatch) -> None:
    """The tree is removed after the run; its results.json is copied out first."""
    results = {"score": 0, "tests": [], "output": ""}

    def fake_image(source: Path, env: dict[str, str], timeout_s: float = 0) -> None:
        runner = source / "run_autograder"
        runner.write_text(f"#!/bin/sh\necho '{json.dumps(results)}' > results/results.json\n")
        runner.chmod(0o755)

    monkeypatch.setattr(run_local_module, "build_image", fake_image)
    monkeypatch.setattr(run_local_module, "unpack", lambda z, tree: _source(tree))
    kept = tmp_path / "kept" / "results.json"
    _, tree = run_local_module.run_local(
        submission=tmp_path, zip_path=tmp_path / "x.zip", kept=kept
    )
    assert json.loads(kept.read_text())["score"] == 0 and not tree.exists()


def _source(tree: Path) -> Path:
    (tree / "source").mkdir(parents=True)
    return tree / "source"


def test_a_passed_check_cases_lets_the_next_build_skip_its_check(checks: list[int]) -> None:
    """`make check-cases` (or a full `make regen`) then `make dist`: checked once."""
    assert cli.main(["regen", "--check"]) == 0
    freshness.ensure_fresh_cases(file=io.StringIO())
    assert len(checks) == 1
    assert freshness.checked_before(freshness.content_digest(), freshness.CHECK_RECORD)
