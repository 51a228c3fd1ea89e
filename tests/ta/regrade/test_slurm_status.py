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


def test_squeue_names_the_tasks_slurm_still_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _squeue(tmp_path, monkeypatch, '#!/bin/sh\nprintf "77_0\\n78_[2-5]\\n"\n')
    assert slurm_status.in_slurm_queue(["77_0", "77_1", "78_3"]) == {"77_0", "78_3"}
    _squeue(tmp_path, monkeypatch, "#!/bin/sh\necho 'slurm_load_jobs error' >&2\nexit 1\n")
    assert slurm_status.in_slurm_queue(["77_0"]) is None  # no answer: keep waiting


def test_pending_tasks_are_named_with_slurms_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``squeue -r -t PD``: one line per pending array task, with its reason; tasks of other
    jobs are left out, and no answer is no reason."""
    _squeue(tmp_path, monkeypatch, '#!/bin/sh\nprintf "77_1|ReqNodeNotAvail, '
            'UnavailableNodes:n3\\n77_2|Resources\\n99_0|Priority\\n"\n')  # fmt: skip
    reasons = slurm_status.pending_reasons(["77_0", "77_1", "77_2"])
    assert reasons == {"77_1": "ReqNodeNotAvail, UnavailableNodes:n3", "77_2": "Resources"}
    note = slurm_status.waiting_note({**reasons, "77_3": "Resources"})
    assert note == ("3 task(s) waiting in Slurm's queue: ReqNodeNotAvail, UnavailableNodes:n3 "
                    "(77_1); Resources (77_2, 77_3)")  # fmt: skip
    assert slurm_status.waiting_note({}) == ""
    _squeue(tmp_path, monkeypatch, "#!/bin/sh\nexit 1\n")
    assert slurm_status.pending_reasons(["77_1"]) == {}


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
    listed = iter([{"77_0"}] * 4)  # listed for four looks, then gone
    held = iter(["ReqNodeNotAvail", "ReqNodeNotAvail", "Resources", "Resources"])
    ended = list(cluster.run_grading_tasks(
        [spec], ClusterOptions(executor="slurm", poll_s=0.01), out_dir=tmp_path,
        queue=lambda ids: next(listed, set()),
        reasons=lambda ids: {"77_0": r} if (r := next(held, "")) else {},
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
