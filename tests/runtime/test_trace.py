"""``KVGRADER_TRACE``: one JSON line per worker request, for profiling a device whose
gradings cannot be watched."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from grader.runtime.trace import TRACE, trace
from tests.conftest import SOLUTION, grade_checks


def test_nothing_is_written_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACE, raising=False)
    monkeypatch.chdir(tmp_path)
    trace(what="x")
    assert list(tmp_path.iterdir()) == []


def test_a_grading_traces_each_request_with_its_worker_start(
    tmp_path: Path, trace_lines: Callable[[], list[dict]]
) -> None:
    graded = grade_checks(SOLUTION, tmp_path / "out", "part2", {"2.2"})
    assert graded.score("2.2") == graded.test("2.2")["max_score"]
    lines = trace_lines()
    assert lines and all(line["part"] == "part2" for line in lines)
    assert lines[0]["start_s"] > 0  # the first request started the worker
    assert all(line["start_s"] == 0 for line in lines[1:] if not line["trusted"])
    assert all(line["seconds"] >= 0 and isinstance(line["timed"], bool) for line in lines)
    assert all(line["check"] == "2.2" for line in lines)  # the check that asked
    assert all(isinstance(line["pid"], int) for line in lines)
    assert all(line["cpu_s"] is None for line in lines if not line["timed"])


def test_warm_up_runs_generate_a_quarter_of_the_tokens(
    tmp_path: Path, trace_lines: Callable[[], list[dict]]
) -> None:
    """Check 4.6's warm-up round (the submission's and the reference's) generates a
    quarter of each L; its timed rounds the whole L."""
    from grader.core.thresholds import load_thresholds

    def warmup_length(n: int) -> int:
        return n // 4

    graded = grade_checks(SOLUTION, tmp_path / "out", "part4", {"4.6"})
    assert graded.test("4.6")["status"] == "passed", graded.output("4.6")
    bench = load_thresholds("cpu")["part4"]
    short, long = bench["L_values"][0], bench["L_values"][-1]
    lines = trace_lines()
    assert {line["check"] for line in lines} == {"4.6"}
    assert all(line["cpu_s"] >= 0 for line in lines if line["timed"])  # the grader's reading
    workers = {line["trusted"]: line["pid"] for line in lines}
    assert workers[True] != workers[False]  # the reference's worker is not the submission's
    for trusted in (False, True):
        timed = [line["what"] for line in lines if line["timed"] and line["trusted"] == trusted]
        cached = [w for w in timed if w.startswith("generate_with_cache(")]
        assert cached[0].endswith(f", {warmup_length(short if not trusted else long)})")
        assert any(w.endswith(f", {long})") for w in cached[1:])
    free = [
        line["what"] for line in lines if line["timed"] and "generate_no_cache(" in line["what"]
    ]
    assert [w.rsplit(", ", 1)[1] for w in free[:2]] == [
        f"{warmup_length(short)})",
        f"{warmup_length(long)})",
    ]
    assert f", {long})" in free[-1]
