"""The TA's subcommands that time the reference (calibrate, reference-benchmarks), apart
from :mod:`grader.cli`'s parser so that each module holds one group of subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.core.registry import parse_parts
from grader.grading.commands import add_device_option, add_parts_option
from grader.ta.regrade.cluster import add_cluster_options


def cmd_calibrate(args: argparse.Namespace) -> int:
    from grader.ta.calibrate import main, main_on_cluster
    from grader.ta.pooled import main_from_results
    from grader.ta.regrade.cluster import ClusterError, options_from_args

    cluster = options_from_args(args)
    json_out = Path(args.json) if args.json else None
    if args.reference_results or args.baseline_results:  # pool gradings made before
        try:
            if not args.reference_results or cluster is not None:
                raise ValueError("results files need --reference-results and no --executor")
            main_from_results(
                reference=[Path(p) for p in args.reference_results],
                baseline=[Path(p) for p in args.baseline_results or []],
                parts=parse_parts(args.parts), margin=args.margin, json_out=json_out,
            )  # fmt: skip
            return 0
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    run = dict(
        device=args.device, parts=parse_parts(args.parts), runs=args.runs, probes=args.probes
    )
    if cluster is None:
        main(**run, margin=args.margin, json_out=json_out)
        return 0
    try:
        return main_on_cluster(**run, margin=args.margin, json_out=json_out, cluster=cluster)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def add_calibrate(sub: argparse._SubParsersAction) -> None:
    ca = sub.add_parser(
        "calibrate",
        help="time the reference and a cache-free baseline; propose thresholds",
        description="Grade the benchmark checks of the reference and of cache-free designs "
        "several times on this machine and propose the thresholds of the device's profile; "
        "also run the work and growth probes on them (on the CPU, every round timed) and "
        "propose their limits, [probes.<part>] of the thresholds file.",
    )
    add_device_option(ca)
    add_parts_option(ca)
    ca.add_argument("--runs", type=int, default=5, help="graded runs of each (default 5)")
    ca.add_argument(
        "--margin", type=float, default=1.5, help="margin where no baseline is told apart"
    )
    ca.add_argument("--json", default="", help="also write the measurements to this file")
    ca.add_argument(
        "--no-probes", dest="probes", action="store_false",
        help="time the benchmarks only, not the work and growth probes ([probes.partN])",
    )  # fmt: skip
    ca.add_argument(
        "--reference-results", nargs="+", metavar="JSON",
        help="grade nothing: pool these results files of the reference's gradings",
    )  # fmt: skip
    ca.add_argument(
        "--baseline-results", nargs="+", metavar="JSON",
        help="with --reference-results: results files of cache-free designs' gradings",
    )  # fmt: skip
    add_cluster_options(ca, array=False)
    ca.set_defaults(func=cmd_calibrate)


def cmd_reference_benchmarks(args: argparse.Namespace) -> int:
    """Time the reference's benchmark checks for the self-check's report: 0 once written,
    1 when the reference did not pass them here."""
    from grader.ta.reference_benchmarks import main as measure

    try:
        doc = measure(out=Path(args.out))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {doc['measured']}")
    return 0


def add_reference_benchmarks(sub: argparse._SubParsersAction) -> None:
    from grader.ta.reference_benchmarks import OUT

    rb = sub.add_parser(
        "reference-benchmarks", help="time the reference for the self-check report's curves"
    )
    rb.add_argument("--out", default=str(OUT), help=f"where to write (default: {OUT.name})")
    rb.set_defaults(func=cmd_reference_benchmarks)
