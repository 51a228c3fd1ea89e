"""``batch --executor slurm`` against a real Slurm (slurmctld, slurmd, munge; accounting
off, Slurm's default), not submitit's local executor: a small export graded as one job
array, an array throttled to one task at a time (``%1``), and array tasks ended from
outside while they run: cancelled, killed at their time limit, their node set down. Each
must end the batch with a result or a status for every submission, be recorded as an
infrastructure failure that names its device, profile and cause, and be graded again by
the next run, which grades nothing else. Needs a cluster answering ``sinfo``: ``make
slurm-tests`` starts a single-node one on this machine (``tests/ta/regrade/local_slurm.sh``)
and runs only these tests."""

from __future__ import annotations

import dataclasses
import functools
import itertools
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


@functools.cache
def _partition() -> str | None:
    """The default partition of a Slurm that answers, or None. Asked when a test here runs,
    not when the module is collected: where Slurm is installed but not running, sinfo takes
    its 10 s to say so, and every test worker of every suite run would wait for it."""
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


pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True)
def _a_cluster_answers() -> None:
    if _partition() is None:
        pytest.skip("no Slurm cluster answers sinfo")


def _options(log_dir: Path) -> ClusterOptions:
    return ClusterOptions(
        executor="slurm", partition=_partition(), cpus_per_task=1, mem_gb=4,
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


def test_an_array_runs_no_more_tasks_at_once_than_its_parallelism(tmp_path: Path) -> None:
    """``--array-parallelism 1`` reaches sbatch as ``%1``, and Slurm holds to it: the three
    tasks' spans (task.json, by the node's clock) do not overlap, on a node with room for
    two at once."""
    entries = [Entry(f"submission_{i}", "solution") for i in (1, 2, 3)]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    options = dataclasses.replace(_options(tmp_path / "logs"), array_parallelism=1)
    summary = batch.main(export_dir=export, out_dir=out, parts=["part1"], timeout_s=300,
                         progress=False, cluster=options)  # fmt: skip
    assert [(r.status, r.total) for r in summary.rows] == [("graded", 20)] * 3
    scripts = [f.read_text() for f in (tmp_path / "logs").rglob("*.sh")]
    assert any("#SBATCH --array=0-2%1" in text for text in scripts), scripts
    spans = sorted(
        (t["started_at"], t["started_at"] + t["elapsed_s"])
        for t in (_task(out, e.folder) for e in entries)
    )
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))


def _stalling_python(tmp_path: Path, folder: str, marker: Path, once: bool = False) -> Path:
    """A ``python`` for grade_one that, for ``folder``, writes its Slurm task id to
    ``marker`` and stalls (only the first time, with ``once``); else the real one."""
    wrapper = tmp_path / "python"
    guard = f"[ -e {marker} ] || " if once else ""
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$4" in */{folder})\n'
        f'  {guard}{{ echo "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}" > {marker}; '
        "sleep 600; };;\n"
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def _ended_from_outside(out: Path, first: batch.BatchSummary, folder: str) -> dict:
    """The first run's record of ``folder``: not graded, a valid fallback that says it is
    not the student's result and names device and profile, submitted again next run."""
    row = next(r for r in first.rows if r.submission_id == folder)
    assert row.status in ("died", "interrupted"), first.rows
    results = out / "results" / folder / "results.json"
    fallback = json.loads(results.read_text())
    validate_results(fallback)
    text = fallback["output"]
    assert "not by this submission" in text or "not this submission's result" in text
    assert fallback["extra_data"]["benchmark_profile"] in ("cpu", "cuda")
    assert fallback["extra_data"]["device"] in ("cpu", "cuda")
    assert batch.is_done(results) is None
    return fallback


def test_a_task_killed_at_its_time_limit_is_retried_by_the_next_run(tmp_path: Path) -> None:
    """Slurm kills a task at its time limit (1 minute here; the grader's own timeout is
    longer, so the limit is the cluster's, not the submission's): the batch ends, the
    fallback names the time limit (from the log Slurm wrote, accounting being off), and
    the next run grades only that submission."""
    entries = [Entry("submission_1", "solution"), Entry("submission_2", "solution")]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    wrapper = _stalling_python(tmp_path, "submission_2", tmp_path / "started")
    options = dataclasses.replace(_options(tmp_path / "logs"), time_limit_min=1)
    run = dict(export_dir=export, out_dir=out, parts=["part1"], timeout_s=300, progress=False,
               cluster=options)  # fmt: skip
    started = time.monotonic()
    first = batch.main(**run, python=str(wrapper))  # type: ignore[arg-type]
    assert time.monotonic() - started < 400  # not waiting on accounting
    assert next(r for r in first.rows if r.submission_id == "submission_1").status == "graded"
    fallback = _ended_from_outside(out, first, "submission_2")
    assert "time limit" in fallback["output"]
    again = batch.main(**run)  # type: ignore[arg-type]
    assert [(r.status, r.total) for r in again.rows] == [("skipped", 20), ("graded", 20)]


def _node() -> str:
    return subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()


def _down_then_resume(marker: Path, events: list[str], down_s: float = 15.0) -> None:
    """Once the task has started: set its node down (as a failing node would be), then
    back up after ``down_s``, as an admin would."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.5)
    if not marker.exists():
        return
    node = _node()
    try:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                        "reason=kvgrader-test"], check=True)  # fmt: skip
        events.append("down")
        time.sleep(down_s)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        events.append("resumed")


def test_a_task_whose_node_goes_down_ends_with_a_result_or_is_retried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node of a running array task is set down mid-array. Slurm either requeues the
    task (it waits, the batch says why, and it runs again once the node is back, in the
    same batch) or ends it; either way
    the batch ends with a result or a status for every submission, never an unending
    wait, and at most one more run leaves every submission graded."""
    entries = [Entry(f"submission_{i}", "solution") for i in (1, 2, 3)]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    marker = tmp_path / "started"
    wrapper = _stalling_python(tmp_path, "submission_2", marker, once=True)
    events: list[str] = []
    watcher = threading.Thread(target=_down_then_resume, args=(marker, events))
    watcher.start()
    run = dict(export_dir=export, out_dir=out, parts=["part1"], timeout_s=300, progress=False,
               cluster=_options(tmp_path / "logs"))  # fmt: skip
    try:
        started = time.monotonic()
        first = batch.main(**run, python=str(wrapper))  # type: ignore[arg-type]
        assert time.monotonic() - started < 600
    finally:
        watcher.join()
    assert events == ["down", "resumed"], "the task never started"
    if any(r.status == "graded" for r in first.rows):  # requeued: it waited, and said why
        assert "waiting in Slurm's queue" in capsys.readouterr().err
    for row in first.rows:  # every submission: a result, or a status saying why not
        assert row.status in ("graded", "died", "interrupted"), first.rows
        results = out / "results" / row.submission_id / "results.json"
        validate_results(json.loads(results.read_text()))
        if row.status != "graded":
            _ended_from_outside(out, first, row.submission_id)
    again = batch.main(**run, python=str(wrapper))  # type: ignore[arg-type]
    assert all((r.status, r.total) in (("graded", 20), ("skipped", 20)) for r in again.rows)
    regraded = {r.submission_id for r in again.rows if r.status == "graded"}
    assert regraded == {r.submission_id for r in first.rows if r.status != "graded"}
