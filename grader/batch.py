"""Regrade a Gradescope "Export Submissions" folder: every submission, one process each.

Gradescope's export is ``submission_metadata.yml`` plus one folder per submission
(``submission_123456789/``). Each folder is graded by ``python -m grader grade`` in
its own process group under a wall-clock timeout, so a submission that hangs or
kills its grader costs one fallback results file, never the batch. Results land
in ``OUT/results/<folder>/results.json``; a valid one is kept on a re-run, so an
interrupted batch resumes where it stopped. ``scores.csv``, ``summary.md``,
``summary.json`` and ``score_histogram.png`` are rebuilt from every results file.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

import grader
from grader.parts import PARTS, parse_parts
from grader.points import part_total
from grader.processes import kill_matching, kill_tree
from grader.results import fallback_results, validate_results, write_results

PROJECT_ROOT = Path(grader.__file__).resolve().parent.parent
METADATA = "submission_metadata.yml"
STATUSES = ("graded", "skipped", "timeout", "error")


class ExportError(ValueError):
    """The export folder or its metadata cannot be used (the CLI exits with status 2)."""


@dataclass(frozen=True)
class Submitter:
    name: str = ""
    sid: str = ""
    email: str = ""


@dataclass
class Row:
    """One submission's line of ``scores.csv``."""

    submission_id: str  # the export's folder name
    submitters: list[Submitter]
    status: str  # one of STATUSES
    parts: dict[str, float | None]  # None: the results hold no check of that part
    total: float
    max_score: float


@dataclass(frozen=True)
class CheckRate:
    number: str
    name: str
    passed: int
    total: int  # results files that contain this check


@dataclass
class BatchSummary:
    """What a batch produced: rows sorted by submission id, and the aggregate numbers."""

    out_dir: Path
    rows: list[Row]
    counts: dict[str, int]  # submissions per status
    stats: dict[str, float]  # mean / median / min / max of the totals
    rates: list[CheckRate]
    elapsed_s: float


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


def natural_key(name: str) -> list[tuple[int, Any]]:
    """Sort ``submission_9`` before ``submission_10``."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"(\d+)", name)]


def part_scores(data: dict[str, Any]) -> dict[str, float | None]:
    """Sum of the scores of the checks tagged with each part (None where a part has none)."""
    scores: dict[str, float | None] = dict.fromkeys(PARTS)
    for test in data.get("tests", []):
        for part in set(PARTS) & set(test.get("tags") or []):
            scores[part] = (scores[part] or 0.0) + float(test.get("score") or 0.0)
    return scores


def pass_rates(results: list[dict[str, Any]]) -> list[CheckRate]:
    """Per numbered check: how many of the results files that contain it passed it.
    Unnumbered entries (a fallback's "Autograder error") are not checks and are left out."""
    table: dict[str, list[Any]] = {}
    for data in results:
        for test in (t for t in data.get("tests", []) if t.get("number")):
            name = str(test.get("name", "")).removeprefix(f"{test['number']} ")
            entry = table.setdefault(test["number"], [name, 0, 0])
            entry[1] += test.get("status") == "passed"
            entry[2] += 1
    return [CheckRate(n, *table[n]) for n in sorted(table, key=natural_key)]


def histogram(totals: list[float], *, max_score: float, bins: int = 10) -> list[tuple]:
    """``(low, high, count)`` for ``bins`` equal bins from 0 to the top score (the last bin
    includes its upper edge), so runs with the same maximum are comparable."""
    top = max([max_score, *totals, 0.0]) or 1.0
    counts = [0] * bins
    for total in totals:
        counts[min(max(int(total * bins / top), 0), bins - 1)] += 1
    return [(i * top / bins, (i + 1) * top / bins, c) for i, c in enumerate(counts)]


def load_valid(path: Path) -> dict[str, Any] | None:
    """The results file at ``path`` if it exists and is valid Gradescope JSON, else None."""
    try:
        data = json.loads(path.read_text())
        validate_results(data)
    except Exception:
        return None
    return data


#: Graders running now, and whether the batch is being interrupted: on Ctrl-C every
#: running grader is killed and writes nothing, so a re-run grades it again.
_live: dict[subprocess.Popen, Path] = {}  # running graders and their sandbox folders
_stopping = threading.Event()


def _kill_tree(proc: subprocess.Popen, folder: Path) -> None:
    """Kill the grader, its workers, and anything still running from its sandbox
    ``folder``: a worker forked just as the grader was killed leaves the tree before it
    can be listed."""
    if proc.poll() is None:
        kill_tree(proc.pid)
        proc.wait()
    kill_matching(lambda p: any(str(folder) in a for a in p.info["cmdline"] or []), ["cmdline"])


def grade_one(
    submission: Path, results: Path, *, parts: list[str], timeout_s: float, python: str
) -> str:
    """Grade one folder in a child process and return its status. Never raises: after a
    timeout, a crash or an invalid file a fallback results file says what happened."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)  # never mistake a stale file for this run's
    cmd = [python, "-m", "grader", "grade", str(submission), "--results", str(results)]
    # The grader's sandboxes go in a folder of ours, removed even when the grader is killed;
    # 0o711 lets the unprivileged worker user reach its sandbox inside.
    tmp = Path(tempfile.mkdtemp(prefix="kvbatch-"))
    tmp.chmod(0o711)
    status, reason = "graded", ""
    try:
        with open(results.parent / "grader.log", "wb") as log:
            proc = subprocess.Popen(
                [*cmd, "--parts", ",".join(parts)],
                cwd=PROJECT_ROOT,
                env={**os.environ, "TMPDIR": str(tmp)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            _live[proc] = tmp
            if _stopping.is_set():  # the batch was interrupted while this one started
                _kill_tree(proc, tmp)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_tree(proc, tmp)
                status, reason = "timeout", f"The regrade timed out after {timeout_s:g} s."
            finally:
                _live.pop(proc, None)
        if _stopping.is_set():
            return "error"  # interrupted: no file, so that a re-run grades it
        data = load_valid(results) if status == "graded" else None
        if status == "graded" and data is None:
            status, reason = "error", f"The grader exited ({code}) without a valid results file."
        elif data and [t.get("name") for t in data["tests"]] == ["Autograder error"]:
            status = "error"  # the grader's own fallback: it failed, and the file says so
    except Exception as exc:
        status, reason = "error", f"The grader could not be run ({type(exc).__name__}: {exc})."
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if reason:
        total = sum(part_total(p) for p in parts)
        write_results(fallback_results(f"{reason} Please tell the course staff.", total), results)
    return status


def make_row(sub_id: str, people: list[Submitter], data: dict[str, Any], status: str) -> Row:
    max_score = sum(float(t.get("max_score") or 0.0) for t in data.get("tests", []))
    return Row(sub_id, people, status, part_scores(data), float(data["score"]), max_score)


def progress_line(done: int, total: int, row: Row, elapsed_s: float) -> str:
    """``[ 7/20] graded submission_123 (12/20) 0:00:41``."""
    return (
        f"[{done:>{len(str(total))}}/{total}] {row.status} {row.submission_id} "
        f"({row.total:g}/{row.max_score:g}) {timedelta(seconds=int(elapsed_s))}"
    )


def main(
    *,
    export_dir: Path,
    out_dir: Path,
    jobs: int = 2,
    parts: list[str] | None = None,
    timeout_s: float = 900,
    python: str = sys.executable,
    progress: bool = True,
) -> BatchSummary:
    """Regrade every submission of ``export_dir`` into ``out_dir`` (resuming) and summarise."""
    started = time.monotonic()
    export_dir, out_dir = Path(export_dir).resolve(), Path(out_dir).resolve()
    parts = parse_parts(",".join(parts or []))
    try:
        metadata = parse_metadata((export_dir / METADATA).read_text())
    except OSError as exc:
        raise ExportError(f"cannot read {METADATA} in {export_dir}: {exc.strerror}") from exc
    dirs = [p for p in export_dir.iterdir() if p.is_dir() and p != out_dir]
    folders = sorted((p.name for p in dirs if not p.name.startswith(".")), key=natural_key)
    for missing in sorted(set(metadata) - set(folders), key=natural_key):
        print(f"warning: {missing} is in {METADATA} but has no folder", file=sys.stderr)
    results_of = {f: out_dir / "results" / f / "results.json" for f in folders}
    rows: dict[str, Row] = {}
    width = 0

    def record(folder: str, data: dict[str, Any], status: str) -> None:
        nonlocal width
        rows[folder] = make_row(folder, metadata.get(folder, []), data, status)
        if progress:
            line = progress_line(len(rows), len(folders), rows[folder], time.monotonic() - started)
            sys.stderr.write("\r" + line.ljust(width))
            sys.stderr.flush()
            width = len(line)

    todo = []
    for folder in folders:
        data = load_valid(results_of[folder])
        if data is None:
            todo.append(folder)
        else:
            record(folder, data, "skipped")
    _stopping.clear()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        run = dict(parts=parts, timeout_s=timeout_s, python=python)
        futures = {pool.submit(grade_one, export_dir / f, results_of[f], **run): f for f in todo}
        for future in as_completed(futures):
            folder = futures[future]
            data = load_valid(results_of[folder]) or fallback_results("no results file")
            record(folder, data, future.result())
    except BaseException:  # Ctrl-C: stop queued gradings and kill the running ones
        _stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        for proc, folder in list(_live.items()):
            _kill_tree(proc, folder)
        raise
    finally:
        pool.shutdown()
    if progress and rows:
        sys.stderr.write("\n")
    ordered, totals = [rows[f] for f in folders], [rows[f].total for f in folders]
    summary = BatchSummary(
        out_dir=out_dir,
        rows=ordered,
        counts={s: sum(r.status == s for r in ordered) for s in STATUSES},
        stats={
            "mean": statistics.fmean(totals) if totals else 0.0,
            "median": float(statistics.median(totals)) if totals else 0.0,
            "min": min(totals, default=0.0),
            "max": max(totals, default=0.0),
        },
        rates=pass_rates([d for f in folders if (d := load_valid(results_of[f]))]),
        elapsed_s=time.monotonic() - started,
    )
    write_outputs(summary)
    return summary


SUMMARY_MD = """# Regrade summary

{submissions} submissions: {counts_text} ({elapsed_s:.0f} s).

Total out of {max_score:g}: mean {total[mean]:.2f}, median {total[median]:g}, \
min {total[min]:g}, max {total[max]:g}.

![score histogram](score_histogram.png)

| check | name | passed | % |
| --- | --- | --- | --- |
"""


def write_outputs(summary: BatchSummary) -> None:
    """``scores.csv``, ``summary.json``, ``summary.md`` and ``score_histogram.png``."""
    out, rows = summary.out_dir, summary.rows
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["submission_id", "names", "emails", "sids", *PARTS, "total", "max_score", "status"]
        )
        for r in rows:
            people = [
                "; ".join(getattr(p, k) for p in r.submitters) for k in ("name", "email", "sid")
            ]
            scores = ["" if r.parts[p] is None else f"{r.parts[p]:g}" for p in PARTS]
            writer.writerow(
                [r.submission_id, *people, *scores, f"{r.total:g}", f"{r.max_score:g}", r.status]
            )
    top = max((r.max_score for r in rows), default=0.0)
    bins = histogram([r.total for r in rows], max_score=top)
    doc = {
        "submissions": len(rows),
        "counts": summary.counts,
        "total": {k: round(v, 4) for k, v in summary.stats.items()},
        "max_score": top,
        "elapsed_s": round(summary.elapsed_s, 2),
        "histogram": [{"low": lo, "high": hi, "count": c} for lo, hi, c in bins],
        "pass_rates": [
            {**asdict(c), "percent": round(100 * c.passed / c.total, 1)} for c in summary.rates
        ],
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    counts_text = ", ".join(f"{n} {s}" for s, n in summary.counts.items())
    row = "| {number} | {name} | {passed}/{total} | {percent:.0f} |\n"
    table = "".join(
        row.format(**{**r, "name": r["name"].replace("|", "/")}) for r in doc["pass_rates"]
    )
    (out / "summary.md").write_text(SUMMARY_MD.format(counts_text=counts_text, **doc) + table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        [b[0] for b in bins], [b[2] for b in bins], width=bins[0][1], align="edge", edgecolor="k"
    )
    ax.set(xlabel="total score", ylabel="submissions", title="Regraded scores")
    fig.tight_layout()
    fig.savefig(out / "score_histogram.png", dpi=100)
    plt.close(fig)
