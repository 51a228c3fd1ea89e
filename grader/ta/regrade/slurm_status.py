"""What Slurm says about an array task, with accounting off (Slurm's default): whether
``squeue`` still lists it, why it holds it back, and why a task ended without a result,
from the line slurmstepd writes into the task's log or submitit's own error. Each report
says that a task's death is the cluster's failure, never the student's result."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

TAIL_LINES = 30

#: A task that died is the cluster's failure, never the student's result.
RETRIED = "It is not this submission's result: the next run submits it again."
#: What slurmstepd writes into a task's stderr when it ends one ("*** JOB 12 ON node1
#: CANCELLED AT 2026-11-26T10:00:00 DUE TO TIME LIMIT ***"), and what it means.
SLURM_CAUSES = (
    ("DUE TO TIME LIMIT", "it reached its time limit"),
    ("DUE TO NODE FAILURE", "its node failed"),
    ("DUE TO PREEMPTION", "it was preempted"),
    ("CANCELLED AT", "it was cancelled"),
)


def slurm_cause(log: str) -> str | None:
    """The cause Slurm wrote into a task's log when it ended the task, if it wrote one:
    with accounting off, the only place that says which it was."""
    for line in reversed(log.splitlines()):
        if re.search(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT", line):
            return next(cause for marker, cause in SLURM_CAUSES if marker in line)
    return None


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' if it is missing)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def death_report(job: Any, exc: BaseException) -> str:
    """Why a task gave no result: its id, Slurm's state for it and the exception's last
    line (a task that raised), or that it was killed, then the end of its logs."""
    lines = [x.strip() for x in str(exc).splitlines()]
    if "----------------------" in lines:  # a FailedJobError quotes the task's traceback
        trace = lines[lines.index("----------------------") + 1 :]
        trace = (
            trace[: trace.index("----------------------")]
            if "----------------------" in trace
            else trace
        )
        why = f"it raised {next((x for x in reversed(trace) if x), type(exc).__name__)}"
    else:
        why = "it ended without a result (killed: out of memory, node failure or a signal)"
    cause = slurm_cause(tail(Path(job.paths.stderr)))
    if cause is None and "timed-out" in str(exc):  # submitit's word for Slurm's signal
        cause = "it reached its time limit"
    why = f"{cause} ({why})" if cause else why
    parts = [f"Cluster task {job.job_id} did not finish (state {job.state}): {why}. {RETRIED}"]
    for name, path in (("stderr", job.paths.stderr), ("stdout", job.paths.stdout)):
        text = tail(Path(path))
        if text:
            parts.append(f"--- end of {name} ({path}) ---\n{text}")
    return "\n".join(parts)


def in_slurm_queue(job_ids: list[str]) -> set[str] | None:
    """The ids among ``job_ids`` that Slurm still lists (pending, running or ending), from
    ``squeue``, which works without accounting; None when squeue cannot answer."""
    base = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(base)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    listed = {line.strip() for line in out.stdout.splitlines() if line.strip()}
    # An array task is listed as "123_4", or inside "123_[4-9]" while it is still pending.
    return {j for j in job_ids if j in listed or any(x.startswith(j.split("_")[0] + "_[")
                                                     for x in listed)}  # fmt: skip


def pending_reasons(job_ids: list[str]) -> dict[str, str]:
    """Why Slurm still holds back each of ``job_ids`` that is pending (its ``%r``: e.g.
    "Resources", "ReqNodeNotAvail, UnavailableNodes:node3"), from ``squeue``; {} when
    squeue cannot answer."""
    base = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-t", "PD", "-o", "%i|%r", "-j", ",".join(base)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    wanted, reasons = set(job_ids), {}
    for line in out.stdout.splitlines():
        job, _, reason = line.partition("|")
        if job.strip() in wanted:
            reasons[job.strip()] = reason.strip() or "unknown"
    return reasons


def waiting_note(reasons: dict[str, str]) -> str:
    """One line for a TA on the tasks Slurm holds back, grouped by reason; '' if none."""
    if not reasons:
        return ""
    by_reason: dict[str, list[str]] = {}
    for job, reason in sorted(reasons.items()):
        by_reason.setdefault(reason, []).append(job)
    groups = "; ".join(f"{r} ({', '.join(jobs)})" for r, jobs in sorted(by_reason.items()))
    return f"{len(reasons)} task(s) waiting in Slurm's queue: {groups}"


def gone_report(job: Any) -> str:
    """Why a task that Slurm stopped listing gave no result: the cause Slurm wrote into
    its log, or the causes it may have had."""
    cause = slurm_cause(tail(Path(job.paths.stderr))) or (
        "cancelled, preempted, or its node was lost; with accounting off, Slurm cannot say "
        "which, and its log does not"
    )
    return (
        f"Cluster task {job.job_id} did not finish: Slurm no longer lists it and it left no "
        f"result ({cause}). {RETRIED}"
    )
