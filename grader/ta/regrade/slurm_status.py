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


def slurm_queue(job_ids: list[str]) -> dict[str, str] | None:
    """The ids among ``job_ids`` that Slurm still lists (pending, running or ending), each
    with why Slurm holds it back while it is pending (its ``%r``: "Resources",
    "ReqNodeNotAvail, UnavailableNodes:node3"; '' once it runs), from one ``squeue`` call,
    which works without accounting; None when squeue cannot answer."""
    base = sorted({j.split("_")[0] for j in job_ids})
    try:
        out = subprocess.run(  # -r: one line per array task, pending ones too
            ["squeue", "-h", "-r", "-o", "%i|%T|%r", "-j", ",".join(base)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    listed = {}
    for line in out.stdout.splitlines():
        job, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if job.strip():
            listed[job.strip()] = (reason.strip() or "unknown") if state == "PENDING" else ""
    return {j: listed[j] for j in job_ids if j in listed}


def waiting_note(listed: dict[str, str]) -> str:
    """One line for a TA on the tasks Slurm holds back (those of ``listed``, as
    :func:`slurm_queue` gives it, with a reason), grouped by reason; '' if none."""
    reasons = {job: reason for job, reason in listed.items() if reason}
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
