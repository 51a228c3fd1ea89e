"""The reference's benchmark records the self-check report draws: the committed file covers
the cpu profile's workloads, and a reference that fails a check writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.core.results import GradingResults
from grader.core.thresholds import load_thresholds
from grader.grading import runner
from grader.grading.selfcheck_page import per_token_curve, speedups
from grader.ta import reference_benchmarks


def test_the_shipped_records_cover_the_cpu_profiles_workloads() -> None:
    """Fails after a change of [cpu.part3] batch sizes or [cpu.part4] lengths until
    `kvgrader reference-benchmarks` measures them again."""
    doc = json.loads(reference_benchmarks.OUT.read_text())
    profile = load_thresholds("cpu")
    assert doc["profile"] == "cpu" and doc["measured"]
    latency = doc["benchmarks"]["4.6"]
    for variant in ("with the cache", "without the cache"):
        assert list(per_token_curve(latency, variant)) == profile["part4"]["L_values"]
    assert list(speedups(doc["benchmarks"]["3.11"])) == profile["part3"]["batch_sizes"]
    assert all(record["passed"] for record in doc["benchmarks"].values())


def test_a_reference_that_fails_a_check_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = {"4.6": {"passed": False}, "3.11": {"passed": True}}
    monkeypatch.setattr(
        runner, "grade", lambda *a, **k: GradingResults(extra_data={"benchmarks": failed})
    )
    out = tmp_path / "ref.json"
    with pytest.raises(RuntimeError, match=r"did not pass 4\.6"):
        reference_benchmarks.main(out=out)
    assert not out.exists()
