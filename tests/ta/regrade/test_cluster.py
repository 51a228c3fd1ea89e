"""The cluster backend of ``batch``: Slurm's sbatch script, submitit's local executor running
the same tasks, tasks that time out or crash, resubmission, and cluster calibration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from submitit.core.utils import DelayedSubmission, UncompletedJobError

from grader import cli
from grader.core.results import validate_results
from grader.ta.regen import import_path
from grader.ta.regrade import batch, cluster, one
from grader.ta.regrade.cluster import ClusterError, ClusterOptions, TaskSpec
from grader.ta.regrade.one import cluster_stop_signal, grade_one
from tests.conftest import ROOT
from tests.ta.regrade.export_factory import Entry, build_export
from tests.test_lock import DEV_LOCK, IMAGE_LOCK, pins

JOB = "4242"


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``srun``, ``sbatch`` (keeps the script it is given, answers job 4242), ``sacct``
    (knows nothing yet), ``squeue`` (reaches no controller, as where Slurm is installed but
    not running: the real one would wait 18 s to say so) and ``scancel`` (notes what it
    cancels) first on PATH."""
    bin_dir, seen = tmp_path / "slurm-bin", tmp_path / "slurm-seen"
    bin_dir.mkdir()
    seen.mkdir()
    scripts = {
        "srun": "exit 0",
        "sbatch": f'cp "$1" {seen}/script.sh\necho "Submitted batch job {JOB}"',
        "sacct": "exit 0",
        "squeue": "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1",
        "scancel": f'echo "$@" >> {seen}/cancelled',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return seen


def _interrupt_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The TA presses Ctrl-C while the batch waits for the cluster."""

    def ctrl_c(_seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster.time, "sleep", ctrl_c)


def _submitted(folder: Path) -> dict[str, tuple]:
    """What submitit pickled for each task under ``folder``: function and arguments."""
    found = {}
    for path in folder.glob("*/*_submitted.pkl"):
        delayed = DelayedSubmission.load(path)
        found[delayed.args[0].folder] = (delayed.function, delayed.args, delayed.kwargs)
    return found


def _task(out: Path, folder: str) -> dict:
    return json.loads((out / "results" / folder / "task.json").read_text())


def test_slurm_gets_one_array_of_the_tasks_that_submitit_local_runs(
    tmp_path: Path, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [Entry(f"submission_{i}", "solution") for i in (1, 2, 3)]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    run = dict(parts=["part1"], timeout_s=900, device="cuda", tags="benchmark", progress=False)
    options = ClusterOptions(
        executor="slurm", partition="gpu-a100", gpus_per_task=1, array_parallelism=2,
        slurm_args={"account": "cs599"}, setup=["module load cuda/12.4"],
    )  # fmt: skip
    with monkeypatch.context() as m:
        _interrupt_waiting(m)
        with pytest.raises(KeyboardInterrupt):
            batch.main(export_dir=export, out_dir=out, cluster=options, **run)

    script = (fake_slurm / "script.sh").read_text()
    flags = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {
        "#SBATCH --partition=gpu-a100",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --array=0-2%2",  # one task per submission, 2 at a time
        "#SBATCH --time=20",  # 900 s per submission + 300 s of start-up, in minutes
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=16GB",
        "#SBATCH --account=cs599",
        "#SBATCH --job-name=kvgrader",
        "#SBATCH --signal=USR2@90",
        f"#SBATCH --output={out}/cluster/%A_%a/%A_%a_0_log.out",
    } <= flags
    assert "module load cuda/12.4" in script
    assert f"{sys.executable} -u -m submitit.core._submit {out}/cluster/%j" in script
    # Interrupted while waiting: every array task is cancelled and will be submitted again.
    cancelled = (fake_slurm / "cancelled").read_text().split()
    assert sorted(cancelled) == [f"{JOB}_{i}" for i in range(3)]
    records = [_task(out, e.folder) for e in entries]
    assert {(r["state"], r["executor"]) for r in records} == {("submitted", "slurm")}
    assert sorted(r["job_id"] for r in records) == sorted(cancelled)
    assert batch.is_done(out / "results" / entries[0].folder / "results.json") is None

    on_slurm = _submitted(out / "cluster")
    assert set(on_slurm) == {e.folder for e in entries}
    function, args, kwargs = on_slurm["submission_2"]
    assert function is cluster.grade_task and kwargs == {}
    assert args == (
        TaskSpec(
            "submission_2", str(export.resolve() / "submission_2"),
            str(out.resolve() / "results" / "submission_2" / "results.json"),
            ["part1"], 900, sys.executable, "cuda", "benchmark",
        ),
    )  # fmt: skip

    # The same batch through submitit's local executor: the same function, the same arguments.
    local = ClusterOptions(executor="submitit-local", log_dir=tmp_path / "local-logs")
    summary = batch.main(export_dir=export, out_dir=out, cluster=local, **run)
    assert summary.counts["skipped"] == 0  # nothing was done: all resubmitted
    assert _submitted(tmp_path / "local-logs") == on_slurm
    assert {_task(out, e.folder)["state"] for e in entries} == {"done"}


def _grader_processes(export: Path) -> list[int]:
    """Graders (and their workers) still running on a submission of ``export``."""
    text = str(export.resolve())
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(text in a for a in p.info["cmdline"] or [])
    ]


def test_a_task_past_its_time_limit_dies_with_its_log_and_leaves_no_grader(
    tmp_path: Path,
) -> None:
    """A 6 s task limit (submitit-local's timeout) on a submission that hangs for 20 s:
    the task is stopped, its grader killed, and the task reported, not dropped."""
    export = build_export(tmp_path / "export", [Entry("submission_7", "hang:sleep")])
    out = tmp_path / "out"
    options = ClusterOptions(executor="submitit-local", time_limit_min=0.1)
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], timeout_s=120, progress=False,
        cluster=options,
    )  # fmt: skip
    assert summary.counts["died"] == 1 and summary.rows[0].status == "died"
    why = summary.died["submission_7"]
    assert "did not finish" in why and "timed-out" in why  # submitit's time-limit message
    assert "--- end of stderr" in why  # the end of the task's log
    data = json.loads((out / "results" / "submission_7" / "results.json").read_text())
    validate_results(data)
    assert data["score"] == 0 and "did not finish" in data["output"]
    task = _task(out, "submission_7")
    assert task["state"] == "died" and Path(task["stderr"]).exists()
    assert "timed-out" in Path(task["stderr"]).read_text()
    assert "## Cluster tasks that died" in (out / "summary.md").read_text()
    assert json.loads((out / "summary.json").read_text())["died"] == summary.died
    assert _grader_processes(export) == []


def _grader_python(tmp_path: Path, line: str) -> Path:
    """A ``python`` for grade_one: a shell script that runs ``line`` first (``$4`` is the
    submission's folder) and, where ``line`` lets it go on, the real interpreter."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n{line}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_grader_that_gets_the_time_limit_signal_first_ends_the_task_as_timed_out(
    tmp_path: Path,
) -> None:
    """The cluster signals a task's processes one after another ahead of its time limit.
    Here the grader of submission_2 gets the signal and the task's own copy never comes:
    the task still ends as timed out (submitit's handler, run for it), so the fallback
    names the time limit, not an unknown SIGUSR2, and the next run grades it again."""
    entries = [Entry("submission_1", "solution"), Entry("submission_2", "solution")]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    signalled = _grader_python(tmp_path, 'case "$4" in */submission_2) kill -USR2 $$;; esac')
    options = ClusterOptions(executor="submitit-local", array_parallelism=2, time_limit_min=1)
    run = dict(export_dir=export, out_dir=out, parts=["part1"], progress=False, cluster=options)
    first = batch.main(**run, python=str(signalled))  # type: ignore[arg-type]
    assert [r.status for r in first.rows] == ["graded", "died"]
    data = json.loads((out / "results" / "submission_2" / "results.json").read_text())
    validate_results(data)
    assert "time limit" in data["output"] and "killed by" not in data["output"]
    again = batch.main(**run)  # type: ignore[arg-type]
    assert [(r.status, r.total) for r in again.rows] == [("skipped", 20), ("graded", 20)]


def test_a_grader_killed_by_the_cluster_signal_outside_a_task_is_only_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a cluster task (no ``SUBMITIT_EXECUTOR``) SIGUSR2 is just a signal that
    killed the grader: the grading is marked interrupted and this process keeps its
    handler."""
    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    signalled = _grader_python(tmp_path, "kill -USR2 $$")
    results = tmp_path / "out" / "results.json"
    status = grade_one(tmp_path, results, parts=["part1"], timeout_s=60, python=str(signalled))
    assert status == "interrupted"
    assert "killed by SIGUSR2" in json.loads(results.read_text())["output"]
    assert cluster_stop_signal() is None
    assert signal.getsignal(signal.SIGUSR2) is not signal.SIG_IGN


def test_the_time_limit_handler_raising_after_the_grader_ended_still_stops_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's own copy of the signal can arrive just after its grader ended, while the
    results are read: submitit's handler raises there, and the task must end as timed out,
    not report that the grader could not be run."""

    def handler_raises(_path: Path) -> None:
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")

    monkeypatch.setattr(one, "load_valid", handler_raises)
    quick = _grader_python(tmp_path, "exit 0")
    with pytest.raises(UncompletedJobError):
        one.grade_one(tmp_path, tmp_path / "out" / "results.json", parts=["part1"],
                      timeout_s=60, python=str(quick))  # fmt: skip


def test_a_crashed_task_is_reported_and_only_it_is_resubmitted(tmp_path: Path) -> None:
    """A grader command that SIGKILLs its task (as an out-of-memory kill would) for one
    submission: that task dies; the next run keeps the other and grades it again."""
    entries = [Entry("submission_1", "solution"), Entry("submission_2", "solution")]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    killer = _grader_python(tmp_path, 'case "$4" in */submission_2) kill -9 $PPID;; esac')
    options = ClusterOptions(executor="submitit-local", array_parallelism=2)
    run = dict(export_dir=export, out_dir=out, parts=["part1"], progress=False, cluster=options)
    first = batch.main(**run, python=str(killer))  # type: ignore[arg-type]
    assert [r.status for r in first.rows] == ["graded", "died"]
    assert first.rows[0].total == 20 and first.rows[1].total == 0
    assert "ended without a result" in first.died["submission_2"]
    kept = _task(out, "submission_1")["job_id"]
    again = batch.main(**run)  # type: ignore[arg-type]
    assert [r.status for r in again.rows] == ["skipped", "graded"]
    assert [r.total for r in again.rows] == [20, 20]
    assert _task(out, "submission_1")["job_id"] == kept  # not submitted again
    assert _task(out, "submission_2")["state"] == "done" and again.died == {}


def test_cli_refuses_slurm_without_slurm_and_cuda_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    build_export(tmp_path / "export", [Entry("submission_1", "blank")])
    base = ["batch", str(tmp_path / "export"), "--out", str(tmp_path / "out")]
    no_slurm = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "srun").exists()
    )
    with pytest.MonkeyPatch.context() as m:
        m.setenv("PATH", no_slurm)
        assert cli.main([*base, "--executor", "slurm", "--partition", "gpu"]) == 2
    assert "--executor submitit-local" in capsys.readouterr().err
    assert cli.main([*base, "--executor", "slurm", "--device", "cuda"]) == 2
    assert "--gpus-per-task" in capsys.readouterr().err
    assert not (tmp_path / "out" / "results").exists()


def test_cluster_options_from_the_command_line() -> None:
    args = cli.build_parser().parse_args(
        ["batch", "exp", "--out", "o", "--executor", "slurm", "--partition", "gpu",
         "--gpus-per-task", "1", "--array-parallelism", "8", "--timeout", "600",
         "--slurm-arg", "account=cs599", "--slurm-arg", "qos=high", "--setup", "module load cuda",
         "--mem-gb", "24", "--device", "cuda", "--tags", "benchmark"]
    )  # fmt: skip
    options = cluster.options_from_args(args)
    assert options == ClusterOptions(
        executor="slurm", partition="gpu", gpus_per_task=1, cpus_per_task=4, mem_gb=24,
        array_parallelism=8, slurm_args={"account": "cs599", "qos": "high"},
        setup=["module load cuda"],
    )  # fmt: skip
    params = cluster.slurm_parameters(options, cluster.limit_seconds(options, args.timeout))
    assert params["time"] == 15 and params["mem"] == "24GB" and params["array_parallelism"] == 8
    assert params["additional_parameters"] == {"account": "cs599", "qos": "high"}
    local = cli.build_parser().parse_args(["batch", "e", "--out", "o"])
    assert cluster.options_from_args(local) is None
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cluster.options_from_args(
            cli.build_parser().parse_args(
                ["batch", "e", "--out", "o", "--executor", "slurm", "--slurm-arg", "account"]
            )
        )


def test_a_command_job_prints_its_output_and_a_dead_one_raises_with_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    options = ClusterOptions(executor="submitit-local")
    command = [sys.executable, "-c", "print('calibrated on', 'the node'); raise SystemExit(3)"]
    assert cluster.run_command_job(command, options, log_dir=tmp_path, cwd=ROOT) == 3
    assert "calibrated on the node" in capsys.readouterr().out
    options = ClusterOptions(executor="submitit-local", time_limit_min=0.05)
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    with pytest.raises(ClusterError, match="did not finish") as caught:
        cluster.run_command_job(sleeper, options, log_dir=tmp_path, cwd=ROOT)
    assert "started" in str(caught.value)  # the end of its log


def test_calibrate_and_the_stability_script_run_themselves_as_cluster_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[list[str]] = []

    def job(command: list[str], options: ClusterOptions, *, log_dir: Path, cwd: Path) -> int:
        ran.append(command)
        assert options.executor == "slurm" and options.gpus_per_task == 1
        return 0

    monkeypatch.setattr(cluster, "run_command_job", job)
    slurm = ["--executor", "slurm", "--partition", "gpu", "--gpus-per-task", "1"]
    out = tmp_path / "cal.json"
    argv = ["calibrate", "--device", "cuda", "--runs", "3", "--json", str(out), *slurm]
    assert cli.main(argv) == 0
    assert ran[-1] == [
        sys.executable, "-m", "grader", "calibrate", "--device", "cuda", "--parts",
        "part1,part2,part3,part4", "--runs", "3", "--margin", "1.5", "--json", str(out),
    ]  # fmt: skip
    module = import_path(ROOT / "benchmarks" / "verdict_stability.py", "verdict_stability")
    argv = ["verdict_stability.py", "--runs", "7", "--device", "cuda", *slurm]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path / "s.json")])
    assert module.main() == 0
    assert ran[-1][1:] == [
        str(ROOT / "benchmarks" / "verdict_stability.py"), "--runs", "7", "--condition", "both",
        "--out", str(tmp_path / "s.json"), "--device", "cuda",
    ]  # fmt: skip


def test_submitit_is_an_optional_extra_in_the_dev_lock_only() -> None:
    assert "submitit" in pins(DEV_LOCK) and "submitit" not in pins(IMAGE_LOCK)
    probe = (
        "import sys, grader.cli, grader.ta.regrade.batch, grader.ta.regrade.merge,"
        " grader.grading.runner, grader.grading.autograder;"
        "print('submitit' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_cli_batch_says_where_the_per_student_table_is(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    build_export(tmp_path / "export", [Entry("submission_1", "blank")])
    out = tmp_path / "out"
    args = ["batch", str(tmp_path / "export"), "--out", str(out), "--parts", "part1", "--quiet"]
    assert cli.main(args) == 0
    printed = capsys.readouterr().out
    assert f"one row per student: {out / 'scores.csv'}" in printed
    assert (out / "scores.csv").is_file()


class _LostJob:
    """A Slurm task that was cancelled with accounting off: submitit never sees it end."""

    def __init__(self, job_id: str, logs: Path) -> None:
        self.job_id = job_id
        self.paths = type("Paths", (), {"stdout": logs / "out", "stderr": logs / "err"})
        self.state = "UNKNOWN"
        self.cancelled = False

    def done(self) -> bool:
        return False

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


def test_a_task_slurm_stops_listing_is_reported_and_submitted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scancel with accounting disabled: submitit cannot learn that the task ended, so the
    batch must not wait for it forever. Once squeue no longer lists it, it is recorded as
    died (not the student's result) and the next run submits it again."""
    jobs: list[_LostJob] = []

    def fake_submit(executor, specs):
        jobs.extend(_LostJob(f"77_{i}", tmp_path) for i, _ in enumerate(specs))
        return list(jobs)

    monkeypatch.setattr(cluster, "make_executor", lambda *a: None)
    monkeypatch.setattr(cluster, "submit", fake_submit)
    monkeypatch.setattr(cluster, "GONE_GRACE_S", 0.0)
    results = tmp_path / "results" / "submission_1" / "results.json"
    spec = TaskSpec("submission_1", str(tmp_path), str(results), ["part1"], 60, sys.executable,
                    device="cuda")  # fmt: skip
    listings = iter([{"77_0": ""}, {}])  # listed at the first look, gone at the second
    options = ClusterOptions(executor="slurm", poll_s=0.01)
    ended = list(cluster.run_grading_tasks(
        [spec], options, out_dir=tmp_path, queue=lambda ids: next(listings, {})
    ))  # fmt: skip
    assert [(s.folder, status) for s, status, _ in ended] == [("submission_1", "died")]
    assert "Slurm no longer lists it" in ended[0][2] and jobs[0].cancelled
    data = json.loads(results.read_text())
    validate_results(data)
    assert (
        data["extra_data"]["device"] == "cuda" and data["extra_data"]["benchmark_profile"] == "cuda"
    )
    assert json.loads((results.parent / "task.json").read_text())["state"] == "died"
    assert batch.is_done(results) is None  # the next run submits it again


def test_a_dead_tasks_fallback_names_the_device_auto_would_have_used() -> None:
    """Found on a real Slurm: a task cancelled with ``--device auto`` left a fallback
    naming no profile. It names the one the node would have used: cuda with GPUs."""
    assert cluster.planned_device("auto", ClusterOptions(gpus_per_task=1)) == "cuda"
    assert cluster.planned_device("auto", ClusterOptions()) == "cpu"
    assert cluster.planned_device("cuda", ClusterOptions()) == "cuda"
