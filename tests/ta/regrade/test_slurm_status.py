"""grader/ta/regrade/slurm_status.py: what Slurm says about a task, with accounting off.
squeue is a stand-in script on PATH here; ``test_real_slurm.py`` asks a real one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from grader.ta.regrade import cluster, slurm_status
from grader.ta.regrade.cluster import ClusterOptions, TaskSpec


class _Job:
    """A submitit job as the reports read it: an id and its log files."""

    def __init__(self, job_id: str, logs: Path) -> None:
        self.job_id = job_id
        self.paths = type("Paths", (), {"stdout": logs / "out", "stderr": logs / "err"})
        self.state = "PENDING"

    def done(self) -> bool:
        return False

    def cancel(self, check: bool = True) -> None:
        pass


def _squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    squeue = tmp_path / "squeue"
    squeue.write_text(script)
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_one_squeue_call_names_the_tasks_slurm_still_holds_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``squeue -r``: one line per array task, pending ones too, with its state and reason.
    A running task is listed without a reason, a pending one with Slurm's; tasks of other
    jobs are left out; no answer is None (keep waiting), an id Slurm no longer knows is
    simply not listed."""
    queue = tmp_path / "queue.txt"
    queue.write_text(
        "77_0|RUNNING|None\n77_1|PENDING|ReqNodeNotAvail, UnavailableNodes:n3\n"
        "77_2|PENDING|Resources\n78_3|PENDING|Resources\n99_0|PENDING|Priority\n"
    )
    only_with_r = f'case " $* " in *" -r "*) cat {queue};; *) exit 1;; esac'
    _squeue(tmp_path, monkeypatch, f"#!/bin/sh\n{only_with_r}\n")
    listed = slurm_status.slurm_queue(["77_0", "77_1", "77_2", "77_4", "78_3"])
    assert listed == {"77_0": "", "77_1": "ReqNodeNotAvail, UnavailableNodes:n3",
                      "77_2": "Resources", "78_3": "Resources"}  # fmt: skip
    note = slurm_status.waiting_note(listed)
    assert note == ("3 task(s) waiting in Slurm's queue: ReqNodeNotAvail, UnavailableNodes:n3 "
                    "(77_1); Resources (77_2, 78_3)")  # fmt: skip
    assert slurm_status.waiting_note({"77_0": ""}) == ""  # running: nothing to say
    _squeue(tmp_path, monkeypatch, "#!/bin/sh\necho 'slurm_load_jobs error' >&2\nexit 1\n")
    assert slurm_status.slurm_queue(["77_0"]) is None  # no answer: keep waiting
    gone = "slurm_load_jobs error: Invalid job id specified"
    _squeue(tmp_path, monkeypatch, f"#!/bin/sh\necho '{gone}' >&2\nexit 1\n")
    assert slurm_status.slurm_queue(["77_0"]) == {}  # ended: Slurm lists none of them


def test_a_waiting_batch_says_why_once_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task held back (its node down) is said once on stderr, again only when the reason
    changes; the batch still ends (the task is gone once Slurm stops listing it)."""
    job = _Job("77_0", tmp_path)
    monkeypatch.setattr(cluster, "make_executor", lambda *a: None)
    monkeypatch.setattr(cluster, "submit", lambda executor, specs: [job])
    monkeypatch.setattr(cluster, "GONE_GRACE_S", 0.0)
    spec = TaskSpec("submission_1", str(tmp_path), str(tmp_path / "r" / "results.json"),
                    ["part1"], 60, sys.executable, device="cuda")  # fmt: skip
    held = ["ReqNodeNotAvail", "ReqNodeNotAvail", "Resources", "Resources"]
    looks = iter([{"77_0": reason} for reason in held])  # listed for four looks, then gone
    ended = list(cluster.run_grading_tasks(
        [spec], ClusterOptions(executor="slurm", poll_s=0.01), out_dir=tmp_path,
        queue=lambda ids: next(looks, {}),
    ))  # fmt: skip
    assert [status for _, status, _ in ended] == ["died"]
    said = [line for line in capsys.readouterr().err.splitlines() if "Slurm's queue" in line]
    assert said == ["1 task(s) waiting in Slurm's queue: ReqNodeNotAvail (77_0)",
                    "1 task(s) waiting in Slurm's queue: Resources (77_0)"]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("slurmstepd: error: *** JOB 41 ON node1 CANCELLED AT 2026-11-26T10:00:00 DUE TO TIME "
         "LIMIT ***", "it reached its time limit"),
        ("slurmstepd: error: *** JOB 41 ON node1 CANCELLED AT 2026-11-26T10:00:00 DUE TO NODE "
         "FAILURE ***", "its node failed"),
        ("slurmstepd: error: *** JOB 41 ON node1 CANCELLED AT 2026-11-26T10:00:00 DUE TO "
         "PREEMPTION ***", "it was preempted"),
        ("slurmstepd: error: *** JOB 41 ON node1 CANCELLED AT 2026-11-26T10:00:00 ***",
         "it was cancelled"),
        ("a student printed *** CANCELLED AT noon DUE TO TIME LIMIT", None),  # not Slurm's
        ("", None),
    ],
)  # fmt: skip
def test_a_gone_tasks_report_names_the_cause_slurm_wrote_in_its_log(
    line: str, cause: str | None, tmp_path: Path
) -> None:
    """With accounting off, the end of the task's stderr is the only place that says why
    Slurm ended it; a report names that cause, or says it cannot tell."""
    job = _Job("77_0", tmp_path)
    Path(job.paths.stderr).write_text(f"grading submission_1\n{line}\n")
    assert slurm_status.slurm_cause(Path(job.paths.stderr).read_text()) == cause
    report = slurm_status.gone_report(job)
    assert (f"({cause})" in report) if cause else ("Slurm cannot say which" in report)
