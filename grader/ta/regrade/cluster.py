"""Grading on a Slurm cluster through submitit: one array task per submission.

``batch --executor slurm`` submits one Slurm job array (one task per submission to
grade, at most ``--array-parallelism`` running at once) through submitit's
``SlurmExecutor``; ``--executor submitit-local`` gives the very same tasks (the same
function, the same arguments) to submitit's ``LocalExecutor`` on this machine. Each
task calls :func:`grader.ta.regrade.one.grade_one`, so a submission is graded on the node
exactly as everywhere else: ``python -m grader grade`` in its own process group,
under the same sandbox and per-submission timeout.

Queueing, retries, node placement and arrays are Slurm's. This module only submits,
waits and records: each task's ``task.json`` (job id, state, node, log files) goes
beside its results, and a task that dies (time limit, node failure, out of memory)
gets a fallback results file quoting the end of its log and state ``died``, so the
next run submits it again. submitit's local executor has no array throttle, so for
it tasks are submitted as earlier ones finish, ``array_parallelism`` at a time.

submitit is the optional extra ``cluster`` (``pip install .[cluster]``); nothing
else imports it, and this module imports it only when an executor is made.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.ta.regrade.slurm_status import (
    death_report,
    gone_report,
    slurm_queue,
    tail,
    waiting_note,
)

EXECUTORS = ("local", "slurm", "submitit-local")
#: Time a task needs beyond its grading: node start-up, imports, CUDA initialisation.
TASK_OVERHEAD_S = 300
#: A task Slurm no longer lists and submitit has not seen finish (with accounting off,
#: submitit cannot learn that a cancelled task ended) is given up after this long.
GONE_GRACE_S = 60.0


class ClusterError(RuntimeError):
    """The cluster cannot be used as asked (no submitit, no Slurm, a refused submission)."""


@dataclass
class ClusterOptions:
    """Where and with what resources the tasks run (the CLI's cluster options)."""

    executor: str = "slurm"  # "slurm" or "submitit-local"
    partition: str | None = None
    gpus_per_task: int = 0
    cpus_per_task: int = 4
    mem_gb: float = 16
    array_parallelism: int | None = None  # at most this many tasks at once (None: Slurm's)
    time_limit_min: float | None = None  # None: the per-submission timeout + TASK_OVERHEAD_S
    slurm_args: dict[str, str] = field(default_factory=dict)  # any other sbatch option
    setup: list[str] = field(default_factory=list)  # shell lines run before each task
    log_dir: Path | None = None  # None: OUT/cluster
    poll_s: float | None = None  # None: 0.25 s for submitit-local, 15 s for Slurm


@dataclass(frozen=True)
class TaskSpec:
    """The arguments of one array task: what :func:`grader.ta.regrade.one.grade_one` needs."""

    folder: str
    submission: str
    results: str
    parts: list[str]
    timeout_s: float
    python: str
    device: str = "auto"
    tags: str = ""


def planned_device(device: str, options: ClusterOptions) -> str:
    """The device a task was to grade on, as its fallback names it when it died before it
    could say: ``device`` itself, or for "auto" what the node resolves it to, "cuda" when
    the task was given GPUs, else "cpu"."""
    if device != "auto":
        return device
    return "cuda" if options.gpus_per_task > 0 else "cpu"


def grade_task(spec: TaskSpec) -> dict[str, Any]:
    """What one array task runs (on the node, or here under submitit-local): grade one
    submission with :func:`grader.ta.regrade.one.grade_one` and say where it ran."""
    from grader.ta.regrade.one import grade_one

    started, began = time.monotonic(), time.time()
    status = grade_one(
        Path(spec.submission), Path(spec.results), parts=list(spec.parts),
        timeout_s=spec.timeout_s, python=spec.python, device=spec.device, tags=spec.tags,
    )  # fmt: skip
    elapsed = round(time.monotonic() - started, 2)
    # When it ran, by the node's clock: a TA can see the array's parallelism in task.json.
    return {"status": status, "elapsed_s": elapsed, "started_at": round(began, 2), **where()}


def where() -> dict[str, str]:
    """The node, its visible GPUs and their names (nvidia-smi, where there is one)."""
    found = {"host": socket.gethostname(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    if shutil.which("nvidia-smi") and found["gpus"]:
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        try:
            names = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
            found["gpu_names"] = "; ".join(n.strip() for n in names.splitlines() if n.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    return found


def run_command(command: list[str], cwd: str) -> int:
    """A job that runs ``command`` (its output goes to the job's log); its exit status.
    Used to run ``calibrate`` and the stability script on a GPU node."""
    proc = subprocess.Popen(command, cwd=cwd, start_new_session=True)
    try:
        return proc.wait()
    except BaseException:  # the time limit's signal, or a cancellation
        from grader.sandbox.processes import kill_tree

        kill_tree(proc.pid)
        raise


def limit_seconds(options: ClusterOptions, timeout_s: float) -> float:
    """The task's wall-clock limit: the option, else the grading timeout plus overhead."""
    if options.time_limit_min is not None:
        return options.time_limit_min * 60
    return timeout_s + TASK_OVERHEAD_S


def slurm_parameters(options: ClusterOptions, limit_s: float) -> dict[str, Any]:
    """``SlurmExecutor.update_parameters`` for ``options``: partition, GPUs, CPUs, memory,
    the time limit in whole minutes, array parallelism and anything else asked for."""
    params: dict[str, Any] = {
        "job_name": "kvgrader",
        "time": max(1, math.ceil(limit_s / 60)),
        "cpus_per_task": options.cpus_per_task,
        "mem": f"{options.mem_gb:g}GB",
        "signal_delay_s": signal_delay(limit_s),
    }
    if options.partition:
        params["partition"] = options.partition
    if options.gpus_per_task:
        params["gpus_per_task"] = options.gpus_per_task
    if options.array_parallelism:
        params["array_parallelism"] = options.array_parallelism
    if options.setup:
        params["setup"] = list(options.setup)
    if options.slurm_args:
        params["additional_parameters"] = dict(options.slurm_args)
    return params


def signal_delay(limit_s: float) -> int:
    """Seconds between submitit's time-limit signal (the task kills its grader and stops)
    and the hard kill: a fifth of the limit, between 1 s and 90 s."""
    return int(min(90, max(1, limit_s / 5)))


def make_executor(options: ClusterOptions, folder: Path, limit_s: float) -> Any:
    """A submitit executor writing its scripts, pickles and logs under ``folder``."""
    try:
        import submitit
    except ImportError as exc:
        raise ClusterError(
            "this executor needs submitit: pip install '.[cluster]' (or `make venv`)"
        ) from exc
    if options.executor == "slurm":
        if shutil.which("srun") is None or shutil.which("sbatch") is None:
            raise ClusterError(
                "no Slurm here (srun/sbatch not found): run on the cluster's login node, or "
                "try the same code path on this machine with --executor submitit-local"
            )
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        executor.update_parameters(**slurm_parameters(options, limit_s))
        return executor
    if options.executor != "submitit-local":
        raise ClusterError(f"unknown executor {options.executor!r} (one of {EXECUTORS})")
    executor = submitit.LocalExecutor(folder=folder, max_num_timeout=0)
    executor.update_parameters(
        timeout_min=limit_s / 60,
        gpus_per_node=options.gpus_per_task,
        signal_delay_s=signal_delay(limit_s),
    )
    return executor


def _write_task(spec: TaskSpec, record: dict[str, Any]) -> None:
    path = Path(spec.results).parent / "task.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")


def run_grading_tasks(
    specs: list[TaskSpec],
    options: ClusterOptions,
    *,
    out_dir: Path,
    queue: Callable[[list[str]], dict[str, str] | None] | None = None,
) -> Iterator[tuple[TaskSpec, str, str]]:
    """Submit one task per spec and yield ``(spec, status, why_it_died)`` as each ends.

    A task that ends without a result is ``died``: a fallback results file holds
    :func:`death_report`, and ``task.json`` says ``died`` so that the next run submits it
    again. ``queue`` (default :func:`slurm_queue` for the slurm executor) says which tasks
    Slurm still lists and why it holds back the pending ones. A task that Slurm stops
    listing without submitit seeing it finish is ``died`` too, after ``GONE_GRACE_S``.
    Whenever the tasks held back, or the reasons (a node down, a partition closed),
    change, one line says so on stderr: a TA sees why a batch waits. If waiting is
    interrupted, every unfinished task is cancelled (its record stays
    ``submitted``, so the next run submits it again too)."""
    from grader.ta.regrade.one import write_fallback

    if not specs:
        return
    limit_s = limit_seconds(options, max(s.timeout_s for s in specs))
    log_dir = Path(options.log_dir or Path(out_dir) / "cluster")
    executor = make_executor(options, log_dir / "%j", limit_s)
    local = options.executor == "submitit-local"
    window = (options.array_parallelism or 2) if local else len(specs)
    poll_s = options.poll_s or (0.25 if local else 15.0)
    pending, running = list(specs), {}
    base = {"executor": options.executor, "device": specs[0].device, "limit_s": limit_s}
    if queue is None and options.executor == "slurm":
        queue = slurm_queue
    said = ""  # the last waiting note printed
    unlisted: dict[Any, float] = {}  # job -> when Slurm was first seen not to list it
    try:
        while pending or running:
            if pending and len(running) < window:
                chunk, pending = pending[: window - len(running)], pending[window - len(running) :]
                for spec, job in zip(chunk, submit(executor, chunk), strict=True):
                    job._results_timeout_s = 2 if local else 15  # shared file systems lag
                    running[job] = spec
                    _write_task(spec, {**base, "job_id": job.job_id, "state": "submitted"})
            finished = [job for job in running if job.done()]
            waiting = [job for job in running if job not in finished]
            listed = queue([str(job.job_id) for job in waiting]) if queue and waiting else None
            gone = gone_jobs(waiting, listed, unlisted)
            for job in finished + gone:
                spec = running.pop(job)
                logs = {"stdout": str(job.paths.stdout), "stderr": str(job.paths.stderr)}
                try:
                    if job in gone:
                        job.cancel(check=False)
                        raise LookupError(gone_report(job))
                    info = job.result()
                except Exception as exc:
                    why = str(exc) if job in gone else death_report(job, exc)
                    device = planned_device(spec.device, options)
                    write_fallback(Path(spec.results), list(spec.parts), why, device=device)
                    _write_task(spec, {**base, "job_id": job.job_id, "state": "died", **logs})
                    yield spec, "died", why
                    continue
                state = "interrupted" if info["status"] == "interrupted" else "done"
                record = {**base, "job_id": job.job_id, "state": state, **logs, **info}
                _write_task(spec, record)
                yield spec, str(info["status"]), ""
            if not finished and not gone:
                said = say_waiting(listed, said)
                time.sleep(poll_s)
    finally:  # interrupted (or an error): nothing we submitted may keep running
        for job in running:
            job.cancel(check=False)


def say_waiting(listed: dict[str, str] | None, said: str) -> str:
    """Print why Slurm holds back tasks (``listed``, from the queue) when that changed
    since ``said``; return what is said now."""
    note = waiting_note(listed or {})
    if note and note != said:
        print(note, file=sys.stderr, flush=True)
    return note


def gone_jobs(
    waiting: list[Any], listed: dict[str, str] | None, unlisted: dict[Any, float]
) -> list[Any]:
    """The unfinished jobs that Slurm has not listed for ``GONE_GRACE_S`` (time for a
    result file to show on a shared file system); none while the queue cannot answer."""
    if listed is None:
        return []
    now = time.monotonic()
    for job in waiting:
        if str(job.job_id) in listed:
            unlisted.pop(job, None)
        else:
            unlisted.setdefault(job, now)
    return [job for job in waiting if job in unlisted and now - unlisted[job] >= GONE_GRACE_S]


def submit(executor: Any, specs: list[TaskSpec]) -> list[Any]:
    """``grade_task`` over ``specs`` as one submitit job array; a refusal is a ClusterError."""
    try:
        return executor.map_array(grade_task, specs)
    except Exception as exc:  # sbatch refused (bad partition, account, limits)
        raise ClusterError(f"the cluster refused the submission: {exc}") from exc


def run_command_job(
    command: list[str], options: ClusterOptions, *, log_dir: Path, cwd: Path
) -> int:
    """Run ``command`` as one cluster job, wait, print its output; return its exit status.
    A job that dies raises ClusterError with the end of its log."""
    limit_s = limit_seconds(options, 2 * 3600 - TASK_OVERHEAD_S)
    executor = make_executor(options, Path(log_dir) / "%j", limit_s)
    try:
        job = executor.submit(run_command, command, str(cwd))
    except Exception as exc:
        raise ClusterError(f"the cluster refused the submission: {exc}") from exc
    print(f"submitted {options.executor} job {job.job_id}; log: {job.paths.stdout}", flush=True)
    try:
        while not job.done():
            time.sleep(options.poll_s or (1.0 if options.executor != "slurm" else 15.0))
        code = int(job.result())
    except KeyboardInterrupt:
        job.cancel(check=False)
        raise
    except Exception as exc:
        raise ClusterError(death_report(job, exc)) from exc
    print(tail(Path(job.paths.stdout), lines=10_000))
    return code


def add_cluster_options(parser: argparse.ArgumentParser, *, array: bool = True) -> None:
    """The ``--executor`` option and the Slurm resources, shared by batch, calibrate and
    the stability script."""
    g = parser.add_argument_group("cluster (submitit; pip install '.[cluster]')")
    g.add_argument(
        "--executor", choices=EXECUTORS, default="local",
        help="local: this machine; slurm: Slurm jobs via submitit; submitit-local: the Slurm "
        "code path through submitit's local executor, on this machine",
    )  # fmt: skip
    g.add_argument("--partition", default=None, help="Slurm partition")
    g.add_argument("--gpus-per-task", type=int, default=0, help="GPUs per task (default 0)")
    g.add_argument("--cpus-per-task", type=int, default=4, help="CPUs per task (default 4)")
    g.add_argument("--mem-gb", type=float, default=16, help="memory per task (default 16)")
    if array:
        g.add_argument(
            "--array-parallelism", type=int, default=None,
            help="tasks running at once (Slurm's %%N; submitit-local default 2)",
        )  # fmt: skip
    g.add_argument(
        "--time-limit", type=float, default=None, metavar="MIN",
        help="task time limit in minutes (batch default: --timeout + 5 min; else 2 h)",
    )  # fmt: skip
    g.add_argument(
        "--slurm-arg", action="append", default=[], metavar="KEY=VALUE",
        help="any other sbatch option, e.g. account=cs599 or qos=high (repeatable)",
    )  # fmt: skip
    g.add_argument(
        "--setup", action="append", default=[], metavar="CMD",
        help="shell line run before each task, e.g. 'module load cuda' (repeatable)",
    )  # fmt: skip
    g.add_argument("--log-dir", default=None, help="submitit's folder (default OUT/cluster)")


def options_from_args(args: argparse.Namespace) -> ClusterOptions | None:
    """ClusterOptions from :func:`add_cluster_options`' values; None for ``local``."""
    if args.executor == "local":
        return None
    extra = {}
    for item in args.slurm_arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--slurm-arg {item!r} is not KEY=VALUE")
        extra[key.strip().lstrip("-")] = value.strip()
    device = getattr(args, "device", "")
    if args.executor == "slurm" and device == "cuda" and args.gpus_per_task < 1:
        raise ValueError("--device cuda on Slurm needs --gpus-per-task 1 (or more)")
    return ClusterOptions(
        executor=args.executor,
        partition=args.partition,
        gpus_per_task=args.gpus_per_task,
        cpus_per_task=args.cpus_per_task,
        mem_gb=args.mem_gb,
        array_parallelism=getattr(args, "array_parallelism", None),
        time_limit_min=args.time_limit,
        slurm_args=extra,
        setup=list(args.setup),
        log_dir=Path(args.log_dir) if args.log_dir else None,
    )
