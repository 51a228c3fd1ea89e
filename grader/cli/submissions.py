"""The TA's subcommands over a term's submissions (batch, merge, show, similarity), apart
from :mod:`grader.cli`'s parser so that each module holds one group of subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.core.registry import parse_parts
from grader.grading.commands import add_device_option, add_parts_option, add_tags_option
from grader.ta.regrade.cluster import add_cluster_options


def cmd_batch(args: argparse.Namespace) -> int:
    """Regrade an export: 0 once the outputs are written; 2 on a bad export, an unknown part,
    bad cluster options or a cluster that cannot be used."""
    from grader.ta.regrade.batch import main as batch
    from grader.ta.regrade.cluster import ClusterError, options_from_args

    try:
        summary = batch(
            export_dir=Path(args.export_dir),
            out_dir=Path(args.out),
            jobs=args.jobs,
            parts=parse_parts(args.parts),
            timeout_s=args.timeout,
            progress=not args.quiet,
            device=args.device,
            tags=args.tags,
            cluster=options_from_args(args),
            regrade=args.regrade,
        )
    except (ValueError, ClusterError) as exc:  # a bad export or option; no usable cluster
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(", ".join(f"{n} {s}" for s, n in summary.counts.items()) + f"; see {summary.out_dir}")
    print(f"one row per student: {summary.out_dir / 'scores.csv'}; the class: "
          f"{summary.out_dir / 'summary.md'} and {summary.out_dir / 'report.html'}")  # fmt: skip
    for folder, why in summary.died.items():
        print(f"\n{folder}: {why}", file=sys.stderr)
    if summary.died:
        print("run the same command again to resubmit the tasks that died", file=sys.stderr)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge CPU and GPU scores: 0 once written, 2 when the inputs cannot be merged."""
    from grader.ta.regrade.merge import main as merge

    try:
        gpu = Path(args.gpu) if args.gpu else None
        summary = merge(cpu=Path(args.cpu), gpu=gpu, out_dir=Path(args.out))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.describe())
    return 0


def add_batch(sub: argparse._SubParsersAction) -> None:
    ba = sub.add_parser("batch", help="regrade a Gradescope 'Export Submissions' folder")
    ba.add_argument(
        "export_dir",
        help="the unzipped export (submission_metadata.yml + folders), or the folder it was "
        "unzipped into",
    )
    ba.add_argument("--out", required=True, help="output folder (a re-run resumes here)")
    ba.add_argument("--jobs", type=int, default=2, help="submissions graded at once")
    add_parts_option(ba)
    ba.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per submission (default: the device profile's grading budget + "
        "the grader's set-up, 900 on cpu)",
    )
    add_device_option(ba)
    add_tags_option(ba)
    ba.add_argument("--quiet", action="store_true", help="no progress bar or lines")
    ba.add_argument(
        "--regrade", action="store_true",
        help="grade again what a previous run into --out graded (after a threshold change)",
    )  # fmt: skip
    add_cluster_options(ba)
    ba.set_defaults(func=cmd_batch)


def add_merge(sub: argparse._SubParsersAction) -> None:
    me = sub.add_parser(
        "merge", help="merge Gradescope's CPU scores with a cluster run's GPU benchmark scores"
    )
    me.add_argument(
        "--cpu", required=True,
        help="a `batch` output folder, or Gradescope's score export (.csv)",
    )  # fmt: skip
    me.add_argument(
        "--gpu", help="the cluster `batch` output folder (leave it out for a CPU-only sheet)"
    )
    me.add_argument("--out", required=True, help="output folder: scores.csv, results/, ...")
    me.set_defaults(func=cmd_merge)


def cmd_show(args: argparse.Namespace) -> int:
    """A stored results.json as `grade --table --details` prints it; 2 when unreadable."""
    import json

    import jsonschema

    from grader.core.results import GradingResults, validate_results
    from grader.core.terminal import terminal_report

    try:
        data = json.loads(Path(args.results).read_text())
        validate_results(data)
    except (OSError, ValueError, jsonschema.ValidationError) as exc:
        why = getattr(exc, "message", exc)  # a schema error's first line, not the schema
        print(f"error: {args.results} is not a readable results file: {why}", file=sys.stderr)
        return 2
    print(terminal_report(GradingResults.from_gradescope(data), details=args.details))
    return 0


def add_show(sub: argparse._SubParsersAction) -> None:
    sh = sub.add_parser("show", help="reprint a stored results.json as a table with feedback")
    sh.add_argument("results", help="a results.json (a grading's, a batch's or a self-check's)")
    sh.add_argument("--no-details", dest="details", action="store_false", help="the table only")
    sh.set_defaults(func=cmd_show)


def cmd_similarity(args: argparse.Namespace) -> int:
    """Rank the submissions of an export by shared code: 0 once written, 2 on a bad export
    or where copydetect is not installed."""
    try:
        from grader.ta.similarity import main as similarity

        pairs = similarity(export_dir=Path(args.export_dir), out_dir=Path(args.out))
    except ModuleNotFoundError as exc:
        print(f"error: {exc.name} is not installed (pip install -e '.[similarity]')",
              file=sys.stderr)  # fmt: skip
        return 2
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    print(f"{len(pairs)} pairs ranked: {out / 'similarity.md'}; matching code highlighted in "
          f"{out / 'similarity.html'} (a lead for a closer look, never a verdict)")  # fmt: skip
    return 0


def add_similarity(sub: argparse._SubParsersAction) -> None:
    si = sub.add_parser(
        "similarity", help="rank an export's submissions by shared code (read, never run)"
    )
    si.add_argument("export_dir", help="a Gradescope 'Export Submissions' folder")
    si.add_argument("--out", default="similarity", help="output folder (default: similarity)")
    si.set_defaults(func=cmd_similarity)
