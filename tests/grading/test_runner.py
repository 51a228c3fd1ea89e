"""grader/grading/runner.py: what a grading tells whom."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from grader.grading.runner import grade
from grader.sandbox.identity import resolve_identity
from tests.conftest import FAST_LIMITS, SOLUTION


@pytest.mark.parametrize("public_only", [False, True])
def test_sandbox_warnings_reach_a_ta_not_a_students_self_check(
    public_only: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A student grading their own code cannot act on the sandbox's security warnings:
    the self-check (a public-only run) keeps them in results.json and prints none."""
    identity = dataclasses.replace(resolve_identity(), warning="a test warning")
    path = tmp_path / "results.json"
    grade(SOLUTION, results_path=path, parts=["part1"], limits=FAST_LIMITS,
          identity=identity, public_only=public_only)  # fmt: skip
    printed = "warning: a test warning" in capsys.readouterr().err
    assert printed is not public_only
    stored = json.loads(path.read_text())["extra_data"]["sandbox_warnings"]
    assert "a test warning" in stored


def test_a_gradings_budget_comes_from_its_device_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile that sets ``grading_budget_s`` (the cuda one: a GPU grading runs on a
    cluster, with workloads sized for arithmetic) gives the watchdog that wall clock and
    keeps the CPU-time backstop above it; a profile without one keeps Gradescope's."""
    from grader.core.thresholds import THRESHOLDS_ENV, thresholds_text
    from grader.grading import runner
    from grader.sandbox.sandbox import Limits
    from grader.ta.regrade.batch import SETUP_ALLOWANCE_S, regrade_timeout_s

    assert runner.limits_for("cpu") == Limits()
    assert regrade_timeout_s("cpu") == Limits().grading_timeout_s + SETUP_ALLOWANCE_S
    cuda = runner.limits_for("cuda")
    assert cuda.grading_timeout_s > Limits().grading_timeout_s  # the shipped cuda profile
    assert cuda.cpu_seconds >= cuda.grading_timeout_s
    assert regrade_timeout_s("cuda") == cuda.grading_timeout_s + SETUP_ALLOWANCE_S
    # A cluster batch left at "auto" waits as long as its GPU nodes' gradings may take.
    from grader.ta.regrade.batch import default_timeout_s
    from grader.ta.regrade.cluster import ClusterOptions

    assert default_timeout_s("auto", ClusterOptions(gpus_per_task=1)) == regrade_timeout_s("cuda")
    assert default_timeout_s("auto", ClusterOptions()) == regrade_timeout_s("cpu")
    assert default_timeout_s("cuda", None) == regrade_timeout_s("cuda")

    text = thresholds_text().replace("[cpu.part2]", "[cpu]\ngrading_budget_s = 4321\n\n[cpu.part2]")
    (tmp_path / "thresholds.toml").write_text(text)
    monkeypatch.setenv(THRESHOLDS_ENV, str(tmp_path / "thresholds.toml"))
    seen: list = []

    def stop_at_once(run: runner.Grading) -> None:
        seen.append(run.limits)
        raise RuntimeError("stopped by the test")

    monkeypatch.setattr(runner.Grading, "reserve", stop_at_once)
    grade(SOLUTION, results_path=tmp_path / "results.json", parts=["part1"], device="cpu")
    assert seen[0].grading_timeout_s == 4321 and seen[0].cpu_seconds == 4321
    # Limits a caller names win over the profile's.
    grade(SOLUTION, results_path=tmp_path / "r2.json", parts=["part1"], device="cpu",
          limits=FAST_LIMITS)  # fmt: skip
    assert seen[1] == FAST_LIMITS
