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

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import yaml

import grader
from grader.parts import PARTS, parse_parts
from grader.points import part_total
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

    submission_id: str
    submitters: list[Submitter]
    status: str  # one of STATUSES
    parts: dict[str, float | None]  # None: no check of that part in the results
    total: float
    max_score: float


@dataclass(frozen=True)
class CheckRate:
    number: str
    name: str
    passed: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.passed / self.total if self.total else 0.0


@dataclass
class BatchSummary:
    """What a batch produced: rows sorted by submission id, and aggregate numbers."""

    out_dir: Path
    rows: list[Row]
    counts: dict[str, int]
    stats: dict[str, float]  # mean / median / min / max of the totals
    rates: list[CheckRate] = field(default_factory=list)
    elapsed_s: float = 0.0


class _Loader(yaml.SafeLoader):
    """Safe loading that reads Ruby-tagged values (``!ruby/object:...``) as plain data."""


def _untagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_Loader.add_multi_constructor("!", _untagged)


def _plain_keys(value: Any) -> Any:
    """Drop the leading colon of Ruby-symbol keys (``:name`` -> ``name``) at every depth."""
    if isinstance(value, dict):
        return {
            (k.lstrip(":") if isinstance(k, str) else k): _plain_keys(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_plain_keys(v) for v in value]
    return value


def parse_metadata(text: str) -> dict[str, list[Submitter]]:
    """Map each submission folder to its submitters; keys may or may not start with ':'."""
    try:
        data = _plain_keys(yaml.load(text, Loader=_Loader))  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ExportError(f"{METADATA} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ExportError(f"{METADATA} must map submission folders to their metadata")
    found: dict[str, list[Submitter]] = {}
    for folder, entry in data.items():
        if not isinstance(entry or {}, dict):
            raise ExportError(f"{METADATA}: the entry of {folder!r} is not a mapping")
        people = (entry or {}).get("submitters") or []
        if not isinstance(people, list):
            raise ExportError(f"{METADATA}: the submitters of {folder!r} are not a list")
        found[str(folder)] = [
            Submitter(*(str(p.get(k) or "") for k in ("name", "sid", "email")))
            for p in people
            if isinstance(p, dict)
        ]
    return found


def natural_key(name: str) -> list[Any]:
    """Sort ``submission_9`` before ``submission_10``."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"(\d+)", name)]


def part_scores(data: dict[str, Any]) -> dict[str, float | None]:
    """Sum of the scores of the checks tagged with each part (None where a part has none)."""
    scores: dict[str, float | None] = dict.fromkeys(PARTS)
    for test in data.get("tests", []):
        for part in PARTS:
            if part in (test.get("tags") or []):
                scores[part] = (scores[part] or 0.0) + float(test.get("score") or 0.0)
    return scores


def pass_rates(results: list[dict[str, Any]]) -> list[CheckRate]:
    """Per numbered check: how many of the results that contain it passed it."""
    table: dict[str, list[Any]] = {}
    for data in results:
        for test in data.get("tests", []):
            if not test.get("number"):
                continue  # the fallback's "Autograder error" is not a check
            entry = table.setdefault(test["number"], [test.get("name", ""), 0, 0])
            entry[1] += test.get("status", "failed") == "passed"
            entry[2] += 1
    return [CheckRate(n, *table[n]) for n in sorted(table, key=natural_key)]


def histogram(totals: list[float], *, max_score: float, bins: int = 10) -> list[tuple]:
    """``(low, high, count)`` for ``bins`` equal bins from 0 to the top score; the last
    bin includes its upper edge."""
    top = max([max_score, *totals, 0.0]) or 1.0
    counts = [0] * bins
    for total in totals:
        counts[min(max(int(total / top * bins), 0), bins - 1)] += 1
    return [(i * top / bins, (i + 1) * top / bins, c) for i, c in enumerate(counts)]


def load_valid(path: Path) -> dict[str, Any] | None:
    """The results file at ``path`` if it exists and is valid Gradescope JSON, else None."""
    try:
        data = json.loads(path.read_text())
        validate_results(data)
    except Exception:
        return None
    return data


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill the grader's process group and its workers (which lead groups of their own)."""
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    for pid in [proc.pid, *(k.pid for k in kids)]:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    for kid in kids:
        with contextlib.suppress(psutil.Error):
            kid.kill()
    proc.wait()


def grade_one(
    submission: Path, results: Path, *, parts: list[str], timeout_s: float, python: str
) -> str:
    """Grade one folder in a child process; return its status. Never raises: on a timeout,
    a crash or an invalid file, a fallback results file says what happened."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    cmd = [python, "-m", "grader", "grade", str(submission.resolve()), "--results", str(results)]
    cmd += ["--parts", ",".join(parts)]
    # The grader's sandboxes go in a folder of our own, removed even if we kill it.
    tmp = Path(tempfile.mkdtemp(prefix="kvbatch-"))
    tmp.chmod(0o711)  # the worker user must reach its sandbox inside
    status, reason = "graded", ""
    try:
        with open(results.parent / "grader.log", "wb") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=PROJECT_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "TMPDIR": str(tmp)},
            )
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_tree(proc)
                status, reason = "timeout", f"The regrade timed out after {timeout_s:g} s."
        data = load_valid(results) if status == "graded" else None
        if status == "graded" and data is None:
            status, reason = "error", f"The grader exited ({code}) without a valid results file."
        elif data and [t.get("name") for t in data["tests"]] == ["Autograder error"]:
            status = "error"  # the grader's own fallback: it failed, and says so
    except Exception as exc:
        status, reason = "error", f"The grader could not be run: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if reason:
        total = sum(part_total(p) for p in parts)
        write_results(fallback_results(f"{reason} Please tell the course staff.", total), results)
    return status


def make_row(sub_id: str, people: list[Submitter], data: dict[str, Any], status: str) -> Row:
    """A CSV row from one results file."""
    max_score = sum(float(t.get("max_score") or 0.0) for t in data.get("tests", []))
    return Row(sub_id, people, status, part_scores(data), float(data["score"]), max_score)


class _Progress:
    """``[ 7/20] graded submission_123 (12/20) 0:00:41`` rewritten in place on stderr."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self.width = total, enabled, 0, 0
        self.started = time.monotonic()

    def update(self, row: Row) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = timedelta(seconds=int(time.monotonic() - self.started))
        line = (
            f"[{self.done:>{len(str(self.total))}}/{self.total}] {row.status} "
            f"{row.submission_id} ({row.total:g}/{row.max_score:g}) {elapsed}"
        )
        sys.stderr.write("\r" + line.ljust(self.width))
        sys.stderr.flush()
        self.width = len(line)

    def close(self) -> None:
        if self.enabled and self.done:
            sys.stderr.write("\n")


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
        raise ExportError(f"cannot read {export_dir / METADATA}: {exc}") from exc
    folders = sorted(
        (
            p.name
            for p in export_dir.iterdir()
            if p.is_dir() and p != out_dir and not p.name.startswith(".")
        ),
        key=natural_key,
    )
    for missing in sorted(set(metadata) - set(folders), key=natural_key):
        print(f"warning: {missing} is in {METADATA} but has no folder", file=sys.stderr)
    bar, rows = _Progress(len(folders), progress), {}
    results_of = {f: out_dir / "results" / f / "results.json" for f in folders}
    todo = []
    for folder in folders:
        data = load_valid(results_of[folder])
        if data is None:
            todo.append(folder)
            continue
        rows[folder] = make_row(folder, metadata.get(folder, []), data, "skipped")
        bar.update(rows[folder])
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {
            pool.submit(
                grade_one,
                export_dir / f,
                results_of[f],
                parts=parts,
                timeout_s=timeout_s,
                python=python,
            ): f
            for f in todo
        }
        for future in as_completed(futures):
            folder = futures[future]
            data = load_valid(results_of[folder]) or fallback_results("no results")
            rows[folder] = make_row(folder, metadata.get(folder, []), data, future.result())
            bar.update(rows[folder])
    bar.close()
    ordered = [rows[f] for f in folders]
    totals = [r.total for r in ordered]
    summary = BatchSummary(
        out_dir=out_dir,
        rows=ordered,
        counts={s: sum(r.status == s for r in ordered) for s in STATUSES},
        stats={
            "mean": statistics.fmean(totals) if totals else 0.0,
            "median": statistics.median(totals) if totals else 0.0,
            "min": min(totals, default=0.0),
            "max": max(totals, default=0.0),
        },
        rates=pass_rates([d for f in folders if (d := load_valid(results_of[f]))]),
        elapsed_s=time.monotonic() - started,
    )
    write_outputs(summary)
    return summary


def write_outputs(summary: BatchSummary) -> None:
    """``scores.csv``, ``summary.json``, ``summary.md`` and ``score_histogram.png``."""
    out = summary.out_dir
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["submission_id", "names", "emails", "sids", *PARTS, "total", "max_score", "status"]
        )
        for r in summary.rows:
            people = [
                "; ".join(getattr(p, k) for p in r.submitters) for k in ("name", "email", "sid")
            ]
            scores = ["" if r.parts[p] is None else f"{r.parts[p]:g}" for p in PARTS]
            totals = [f"{r.total:g}", f"{r.max_score:g}", r.status]
            writer.writerow([r.submission_id, *people, *scores, *totals])
    top = max((r.max_score for r in summary.rows), default=0.0)
    bins = histogram([r.total for r in summary.rows], max_score=top)
    _plot(bins, out / "score_histogram.png")
    stats = {k: round(v, 4) for k, v in summary.stats.items()}
    doc = {
        "submissions": len(summary.rows),
        "counts": summary.counts,
        "total": stats,
        "max_score": top,
        "elapsed_s": round(summary.elapsed_s, 2),
        "histogram": [{"low": lo, "high": hi, "count": c} for lo, hi, c in bins],
        "pass_rates": [{**asdict(c), "percent": round(c.percent, 1)} for c in summary.rates],
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# Regrade summary",
        "",
        f"{len(summary.rows)} submissions: "
        + ", ".join(f"{n} {s}" for s, n in summary.counts.items())
        + f" ({summary.elapsed_s:.0f} s).",
        "",
        f"Total (of {top:g}): mean {stats['mean']:g}, median {stats['median']:g}, "
        f"min {stats['min']:g}, max {stats['max']:g}.",
        "",
        "![score histogram](score_histogram.png)",
        "",
        "| check | name | passed | % |",
        "| --- | --- | --- | --- |",
        *(
            f"| {c.number} | {c.name.replace('|', '/')} | {c.passed}/{c.total} | {c.percent:.0f} |"
            for c in summary.rates
        ),
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def _plot(bins: list[tuple], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        [lo for lo, _, _ in bins],
        [c for *_, c in bins],
        width=bins[0][1] - bins[0][0],
        align="edge",
        edgecolor="black",
    )
    ax.set_xlabel("total score")
    ax.set_ylabel("submissions")
    ax.set_title("Regraded scores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``batch`` options, shared by ``python -m grader.batch`` and the main CLI."""
    parser.add_argument("export_dir", help="Gradescope 'Export Submissions' folder (unzipped)")
    parser.add_argument("--out", required=True, help="output folder (re-runs resume here)")
    parser.add_argument("--jobs", type=int, default=2, help="submissions graded at once")
    parser.add_argument("--parts", default="", help="comma-separated part tags (default: all)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per submission")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def cmd_batch(args: argparse.Namespace) -> int:
    """Run :func:`main` from parsed arguments: 0 once outputs are written, 2 on a bad export."""
    try:
        summary = main(
            export_dir=Path(args.export_dir),
            out_dir=Path(args.out),
            jobs=args.jobs,
            parts=parse_parts(args.parts),  # raises ValueError on an unknown part
            timeout_s=args.timeout,
            progress=not args.quiet,
        )
    except ValueError as exc:  # ExportError, or an unknown part
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(", ".join(f"{n} {s}" for s, n in summary.counts.items()) + f"; see {summary.out_dir}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m grader.batch", description=__doc__.split("\n")[0])
    add_arguments(p)
    sys.exit(cmd_batch(p.parse_args()))
