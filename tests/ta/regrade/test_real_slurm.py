"""``batch --executor slurm`` against a real Slurm (slurmctld, slurmd, munge; accounting
off, Slurm's default), not submitit's local executor: a small export graded as one job
array, and an array task cancelled while it runs, which must be recorded as an
infrastructure failure that names its device and profile and be graded again by the next
run. Needs a cluster answering ``sinfo``: ``make slurm-tests`` starts a single-node one
on this machine (``tests/ta/regrade/local_slurm.sh``) and runs only these tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grader.core.results import validate_results
from grader.ta.regrade import batch
from grader.ta.regrade.cluster import ClusterOptions
from tests.ta.regrade.export_factory import Entry, build_export


def _partition() -> str | None:
    """The default partition of a Slurm that answers, or None."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P %a"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        name, state = line.split()
        if state == "up":
            return name.rstrip("*")
    return None


PARTITION = _partition()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(PARTITION is None, reason="no Slurm cluster answers sinfo"),
]


def _options(log_dir: Path) -> ClusterOptions:
    return ClusterOptions(
        executor="slurm", partition=PARTITION, cpus_per_task=1, mem_gb=4,
        time_limit_min=10, log_dir=log_dir, poll_s=1.0,
    )  # fmt: skip


def _task(out: Path, folder: str) -> dict:
    return json.loads((out / "results" / folder / "task.json").read_text())


def test_a_small_export_is_graded_as_one_slurm_array(tmp_path: Path) -> None:
    entries = [Entry(f"submission_{i}", "solution") for i in (1, 2, 3)]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], timeout_s=300, progress=False,
        cluster=_options(tmp_path / "logs"),
    )  # fmt: skip
    assert [(r.status, r.total) for r in summary.rows] == [("graded", 20)] * 3
    jobs = {_task(out, e.folder)["job_id"] for e in entries}
    assert len({j.split("_")[0] for j in jobs}) == 1 and len(jobs) == 3  # one array
    assert all(_task(out, e.folder)["executor"] == "slurm" for e in entries)


def _cancel_when_running(folder_marker: Path, cancelled: list[str]) -> None:
    """scancel the array task whose grading has started (its marker file appeared)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not folder_marker.exists():
        time.sleep(0.5)
    job = folder_marker.read_text().strip() if folder_marker.exists() else ""
    if job:
        subprocess.run(["scancel", job], check=False)
        cancelled.append(job)


def test_a_cancelled_task_is_recorded_with_its_profile_and_graded_again(tmp_path: Path) -> None:
    """The first run's grader for submission_2 writes its Slurm task id and waits; the task
    is cancelled from outside (as a TA, preemption or a lost node would). The batch must
    end (not wait for Slurm's accounting, which is off), record the task as not the
    student's result with its device and profile, and the next run grade it."""
    entries = [Entry("submission_1", "solution"), Entry("submission_2", "solution")]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    marker = tmp_path / "started"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$4" in */submission_2)\n'
        f'  echo "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}" > {marker}; sleep 600;;\n'
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    cancelled: list[str] = []
    watcher = threading.Thread(target=_cancel_when_running, args=(marker, cancelled))
    watcher.start()
    run = dict(export_dir=export, out_dir=out, parts=["part1"], timeout_s=300, progress=False,
               cluster=_options(tmp_path / "logs"))  # fmt: skip
    started = time.monotonic()
    first = batch.main(**run, python=str(wrapper))  # type: ignore[arg-type]
    watcher.join()
    assert cancelled, "the task never started"
    assert time.monotonic() - started < 300  # ended, not waiting on accounting
    statuses = [r.status for r in first.rows]
    assert statuses[0] == "graded" and statuses[1] in ("died", "interrupted"), first.rows
    fallback = json.loads((out / "results" / "submission_2" / "results.json").read_text())
    validate_results(fallback)
    assert "not by this submission" in fallback["output"]  # not the student's result
    assert fallback["extra_data"]["benchmark_profile"] in ("cpu", "cuda")
    assert fallback["extra_data"]["device"] in ("cpu", "cuda")
    assert batch.is_done(out / "results" / "submission_2" / "results.json") is None
    again = batch.main(**run)  # type: ignore[arg-type]
    assert [(r.status, r.total) for r in again.rows] == [("skipped", 20), ("graded", 20)]
