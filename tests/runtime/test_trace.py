"""``KVGRADER_TRACE``: one JSON line per worker request, for profiling a device whose
gradings cannot be watched."""

from __future__ import annotations

import json
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE, str(log))
    graded = grade_checks(SOLUTION, tmp_path / "out", "part2", {"2.2"})
    assert graded.score("2.2") == graded.test("2.2")["max_score"]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and all(line["part"] == "part2" for line in lines)
    assert lines[0]["start_s"] > 0  # the first request started the worker
    assert all(line["start_s"] == 0 for line in lines[1:] if not line["trusted"])
    assert all(line["seconds"] >= 0 and isinstance(line["timed"], bool) for line in lines)
