"""Regrade a Gradescope "Export Submissions" folder: every submission, one process each.

Gradescope's export is ``submission_metadata.yml`` plus one folder per submission
(``submission_123456789/``), found where it was named or one folder down
(:func:`grader.ta.regrade.export.find_export`). Each folder is graded by
``python -m grader grade`` in its own process group under a wall-clock timeout, so a
submission that hangs or kills its grader costs one fallback results file, never the batch.
Results land in ``OUT/results/<folder>/results.json``; a valid one is kept on a re-run, so
an interrupted batch resumes where it stopped, unless ``regrade`` asks for every submission
to be graded again (after a threshold changed). ``scores.csv``, ``summary.md``,
``summary.json`` and ``score_histogram.png`` are rebuilt from every results file.
Progress is a tqdm bar on a terminal; where stdout is not one (``make batch > log``), a
line per submission as it ends, so a log shows how far the batch got.

Where the gradings run is the executor's choice: ``local`` (threads on this
machine), or one Slurm array task per submission through submitit
(:mod:`grader.ta.regrade.cluster`: ``slurm``, or ``submitit-local`` for the same code path on
this machine). Each cluster task writes ``task.json`` beside its results; a task
that died is graded again by the next run.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from pathlib import Path
from typing import IO, Any

import yaml
from tqdm import tqdm

from grader.core.registry import PARTS, parse_parts
from grader.core.results import fallback_results
from grader.core.thresholds import resolve_device
from grader.grading.runner import limits_for, worker_threads
from grader.sandbox.sandbox import worker_environment
from grader.sandbox.shared import SharedForkServer, start_shared
from grader.ta.regrade.census import census, timing_doubts
from grader.ta.regrade.class_page import write_class_page
from grader.ta.regrade.cluster import ClusterOptions, planned_device
from grader.ta.regrade.export import METADATA, ExportError, find_export, submission_folders
from grader.ta.regrade.one import allow_running, grade_one, load_valid, stop_running
from grader.ta.regrade.outputs import (
    STATUSES,
    BatchSummary,
    CheckRate,
    Row,
    Submitter,
    earlier_statuses,
    histogram,
    make_row,
    natural_key,
    part_scores,
    pass_rates,
    write_outputs,
)

__all__ = [
    "METADATA", "STATUSES", "BatchSummary", "CheckRate", "ExportError", "Row", "Submitter",
    "grade_one", "histogram", "main", "make_row", "natural_key", "parse_metadata",
    "part_scores", "pass_rates", "write_outputs",
]  # fmt: skip

#: Written beside a cluster task's results: its job id, state and log files.
TASK_FILE = "task.json"


class _Loader(yaml.SafeLoader):
    """Safe loading that reads Ruby-tagged values (``!ruby/object:...``) as plain data."""


_Loader.add_multi_constructor("!", lambda ld, _tag, node: getattr(ld, f"construct_{node.id}")(node))


def _plain_keys(value: Any) -> Any:
    """Drop the leading colon of Ruby-symbol keys (``:name`` -> ``name``) at every depth."""
    if isinstance(value, dict):
        return {
            (k.lstrip(":") if isinstance(k, str) else k): _plain_keys(v) for k, v in value.items()
        }
    return [_plain_keys(v) for v in value] if isinstance(value, list) else value


def parse_metadata(text: str) -> dict[str, list[Submitter]]:
    """Map each submission folder to its submitters; keys may or may not start with ':'."""
    try:
        data = _plain_keys(yaml.load(text, Loader=_Loader))  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ExportError(f"{METADATA} is not valid YAML: {exc}") from exc
    if not isinstance(data or {}, dict):
        raise ExportError(f"{METADATA} must map submission folders to their metadata")
    found: dict[str, list[Submitter]] = {}
    for folder, entry in (data or {}).items():
        if not isinstance(entry or {}, dict):
            raise ExportError(f"{METADATA}: the entry of {folder!r} is not a mapping")
        people = (entry or {}).get("submitters") or []
        if not isinstance(people, list):
            raise ExportError(f"{METADATA}: the submitters of {folder!r} are not a list")
        found[str(folder)] = [
            Submitter(*(str(p.get(k) or "") for k in ("name", "sid", "email")))
            for p in people or []
            if isinstance(p, dict)
        ]
    return found


def is_done(results: Path) -> dict[str, Any] | None:
    """The results of a submission that needs no grading: a valid file, unless it says the
    grading was interrupted (the infrastructure's doing, not the student's) or a cluster
    task record beside it says the task did not finish (then it is graded again)."""
    task = results.parent / TASK_FILE
    if task.exists():
        try:
            if json.loads(task.read_text()).get("state") != "done":
                return None
        except (OSError, ValueError):
            return None
    data = load_valid(results)
    if data is not None and (data.get("extra_data") or {}).get("interrupted"):
        return None
    return data


def progress_bar(
    total: int, *, initial: int = 0, enabled: bool = True, file: IO | None = None
) -> tqdm:
    """A tqdm bar with rate and ETA over the submissions graded in this run (``initial``
    ones were already done); silent when ``file`` (stderr) is not a terminal."""
    return tqdm(
        total=total,
        initial=initial,
        unit="sub",
        file=file or sys.stderr,
        disable=None if enabled else True,  # None: off unless the file is a terminal
        dynamic_ncols=True,
        smoothing=0,  # the average over the run: gradings vary too much for a moving rate
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]{postfix}",
    )


class LineLog:
    """A line per submission as its grading ends, for a log rather than a terminal
    (``make batch > log``: a bar would only reach the file at the end, if at all)."""

    def __init__(self, total: int, skipped: int, file: IO | None, *, enabled: bool = True) -> None:
        """Print to ``file`` (default stdout) only when enabled and it is not a terminal;
        ``skipped`` submissions were graded before and are announced in one line."""
        file = sys.stdout if file is None else file
        self.file = None if not enabled or _is_terminal(file) else file
        self.total, self.done, self.started = total, skipped, time.monotonic()
        if self.file is not None and skipped:
            print(f"{skipped} of {total} already graded: kept (--regrade grades them again)",
                  file=self.file, flush=True)  # fmt: skip

    def record(self, row: Row) -> None:
        """One line: the count, the submission, its students, status, score, and the time
        since the batch started (said so: a submission's own time is not known here)."""
        self.done += 1
        if self.file is None:
            return
        names = ", ".join(p.name for p in row.submitters if p.name) or "(no name)"
        elapsed = time.monotonic() - self.started
        line = (f"[{self.done}/{self.total}] {row.submission_id} {names}: {row.status} "
                f"{row.score.text()} ({elapsed:.0f} s into the batch)")  # fmt: skip
        print(line, file=self.file, flush=True)


def _is_terminal(file: IO) -> bool:
    """Whether ``file`` is a terminal (a file without ``isatty`` is not)."""
    isatty = getattr(file, "isatty", None)
    return bool(isatty and isatty())


#: Seconds a regrade allows beyond the grading's own budget: the grader's start (torch's
#: import, the sandbox), the reference's runs before the submission's, and the close.
SETUP_ALLOWANCE_S = 420


def regrade_timeout_s(device: str) -> float:
    """Seconds one submission's regrade may take on ``device``: its grading budget (the
    device profile's, else Gradescope's) and the set-up around it."""
    return limits_for(resolve_device(device)).grading_timeout_s + SETUP_ALLOWANCE_S


def default_timeout_s(device: str, cluster: ClusterOptions | None) -> float:
    """A submission's regrade timeout when none is given: for ``device``, or for "auto" on
    a cluster, the device its nodes resolve it to (cuda where tasks get GPUs)."""
    return regrade_timeout_s(planned_device(device, cluster) if cluster else device)


def main(
    *,
    export_dir: Path,
    out_dir: Path,
    jobs: int = 2,
    parts: list[str] | None = None,
    timeout_s: float | None = None,
    python: str = sys.executable,
    progress: bool = True,
    device: str = "auto",
    tags: str = "",
    cluster: ClusterOptions | None = None,
    progress_file: IO | None = None,
    regrade: bool = False,
    line_file: IO | None = None,
) -> BatchSummary:
    """Regrade every submission of ``export_dir`` into ``out_dir`` (resuming) and summarise.

    ``cluster`` None grades ``jobs`` submissions at a time on this machine; otherwise each
    submission is one submitit array task (:func:`grader.ta.regrade.cluster.run_grading_tasks`).
    ``device`` and ``tags`` are passed to every ``grade`` (e.g. ``cuda`` and ``benchmark``).
    ``regrade`` grades again what a previous run graded. With ``progress``, a bar on
    ``progress_file`` (stderr) when it is a terminal, and a line per submission on
    ``line_file`` (stdout) when that is not one."""
    started = time.monotonic()
    if timeout_s is None:
        timeout_s = default_timeout_s(device, cluster)
    export_dir = find_export(Path(export_dir)).resolve()
    out_dir = Path(out_dir).resolve()
    parts = parse_parts(",".join(parts or []))
    metadata, folders = read_export(export_dir, out_dir)
    results_of = {f: out_dir / "results" / f / "results.json" for f in folders}
    todo, rows = plan(folders, results_of, metadata, regrade=regrade)
    earlier = earlier_statuses(out_dir)
    for folder, row in rows.items():  # a kept row's record: how its grading ended then
        row.earlier = earlier.get(folder, "graded")
    died: dict[str, str] = {}
    bar = progress_bar(len(folders), initial=len(rows), enabled=progress, file=progress_file)
    lines = LineLog(len(folders), len(rows), line_file, enabled=progress)

    def record(folder: str, status: str) -> None:
        data = load_valid(results_of[folder]) or fallback_results("no results file")
        rows[folder] = row = make_row(folder, metadata.get(folder, []), data, status)
        bar.set_postfix_str(f"{row.status} {row.submission_id} ({row.score.text()})", refresh=False)
        bar.update()
        lines.record(row)

    run = dict(parts=parts, timeout_s=timeout_s, python=python, device=device, tags=tags)
    try:
        if cluster is None:
            _grade_here(todo, export_dir, results_of, jobs, run, record)
        else:
            died = _grade_on_cluster(todo, export_dir, results_of, run, record, cluster, out_dir)
    finally:
        bar.close()
    results = {f: data for f in folders if (data := load_valid(results_of[f]))}
    summary = summarise(out_dir, [rows[f] for f in folders], results, died, started)
    write_outputs(summary)
    write_class_page(out_dir, summary.rows, results, f"Regrade of {export_dir.name}")
    return summary


def plan(
    folders: list[str],
    results_of: dict[str, Path],
    metadata: dict[str, list[Submitter]],
    *,
    regrade: bool,
) -> tuple[list[str], dict[str, Row]]:
    """The folders to grade, and the rows of those kept from an earlier run (every folder
    is graded when ``regrade``); a stale cluster task record is removed before grading."""
    todo: list[str] = []
    rows: dict[str, Row] = {}
    for folder in folders:
        data = None if regrade else is_done(results_of[folder])
        if data is None:
            todo.append(folder)
            (results_of[folder].parent / TASK_FILE).unlink(missing_ok=True)
        else:
            rows[folder] = make_row(folder, metadata.get(folder, []), data, "skipped")
    return todo, rows


def read_export(export_dir: Path, out_dir: Path) -> tuple[dict[str, list[Submitter]], list[str]]:
    """The export's metadata and its submission folders, in natural order (a folder the
    metadata names but the export lacks is reported and skipped; so is one that is a link
    or resolves outside the export, which is never graded: :mod:`grader.ta.regrade.export`)."""
    try:
        metadata = parse_metadata((export_dir / METADATA).read_text())
    except OSError as exc:
        raise ExportError(f"cannot read {METADATA} in {export_dir}: {exc.strerror}") from exc
    found, refused = submission_folders(export_dir, skip=out_dir)
    folders = [p.name for p in found]
    for missing in sorted(set(metadata) - set(folders) - set(refused), key=natural_key):
        print(f"warning: {missing} is in {METADATA} but has no folder", file=sys.stderr)
    for unnamed in sorted(set(folders) - set(metadata), key=natural_key):
        print(
            f"warning: {unnamed} has a folder but no entry in {METADATA}: it is graded, "
            "with no names in scores.csv",
            file=sys.stderr,
        )
    return metadata, folders


def summarise(
    out_dir: Path,
    rows: list[Row],
    results: dict[str, dict[str, Any]],
    died: dict[str, str],
    started: float,
) -> BatchSummary:
    """The batch's counts, score statistics and per-check pass rates (``results``: each
    submission's valid results file, read once)."""
    totals = [r.total for r in rows]
    return BatchSummary(
        out_dir=out_dir,
        rows=rows,
        counts={s: sum(r.status == s for r in rows) for s in STATUSES},
        stats={
            "mean": statistics.fmean(totals) if totals else 0.0,
            "median": float(statistics.median(totals)) if totals else 0.0,
            "min": min(totals, default=0.0),
            "max": max(totals, default=0.0),
        },
        rates=pass_rates(list(results.values())),
        elapsed_s=time.monotonic() - started,
        died=died,
        causes=census(results),
        doubts=timing_doubts(results),
    )


def _grade_on_cluster(
    todo: list[str],
    export_dir: Path,
    results_of: dict[str, Path],
    run: dict[str, Any],
    record: Callable[[str, str], None],
    cluster: ClusterOptions,
    out_dir: Path,
) -> dict[str, str]:
    """The cluster executor: one submitit array task per submission; returns why each
    task that died did."""
    from grader.ta.regrade.cluster import TaskSpec, run_grading_tasks

    died: dict[str, str] = {}
    specs = [
        TaskSpec(f, str(export_dir / f), str(results_of[f]), **run)  # type: ignore[arg-type]
        for f in todo
    ]
    with closing(run_grading_tasks(specs, cluster, out_dir=out_dir)) as ended:
        for spec, status, why in ended:
            if why:
                died[spec.folder] = why
            record(spec.folder, status)
    return died


def _grade_here(
    todo: list[str],
    export_dir: Path,
    results_of: dict[str, Path],
    jobs: int,
    run: dict[str, Any],
    record: Callable[[str, str], None],
) -> None:
    """The local executor: ``jobs`` gradings at a time in threads of this process, their
    workers forked from one shared fork server (the libraries imported once) on a CPU."""
    allow_running()
    shared = None
    if todo:
        shared = shared_server(device=run["device"], parts=run["parts"], python=run["python"])
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = {
            pool.submit(grade_one, export_dir / f, results_of[f], **run, shared=shared): f
            for f in todo
        }
        for future in as_completed(futures):
            record(futures[future], future.result())
    except BaseException:  # Ctrl-C: stop queued gradings and kill the running ones
        pool.shutdown(wait=False, cancel_futures=True)
        stop_running()
        raise
    finally:
        pool.shutdown()
        if shared is not None:
            shared.close()


def shared_server(
    *, device: str, parts: list[str], python: str = sys.executable
) -> SharedForkServer | None:
    """The fork server that gradings of ``parts`` on ``device`` share where they run on
    this machine's CPU (a GPU's workers are started, not forked), preloading what every
    part needs and what its workers would import in every grading (``class_preload``);
    None, said on stderr, where it cannot start. The caller closes it."""
    if resolve_device(device) != "cpu":
        return None
    preload: list[str] = []
    for part in parts:
        wanted = PARTS[part].preload + PARTS[part].class_preload
        preload += [spec for spec in wanted if spec not in preload]
    env = worker_environment(None, "cpu", worker_threads())
    shared, why = start_shared(tuple(preload), env, python)
    if why:
        print(f"warning: each grading imports its libraries itself: {why}", file=sys.stderr)
    return shared
