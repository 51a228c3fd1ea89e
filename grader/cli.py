"""``python -m grader`` (``.venv/bin/kvgrader``): the TA's command line. Each subcommand
is a thin wrapper over a keyword-only function; what ``--help`` says is :data:`DESCRIPTION`,
written for a TA."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from grader import DESCRIPTION, EPILOG, version
from grader.core.registry import parse_parts
from grader.grading.commands import (
    add_device_option,
    add_grade,
    add_gradescope,
    add_parts_option,
    add_tags_option,
    run,
)
from grader.ta.regrade.cluster import add_cluster_options


def cmd_regen(args: argparse.Namespace) -> int:
    """assignment/ from solution/'s markers, then test_cases/; ``--check`` only compares."""
    from grader.ta import regen, skeleton
    from grader.ta.freshness import record_fresh

    if args.check:
        problems = regen.check(parts=parse_parts(args.parts))  # assignment/ included
        if not problems and not args.parts:
            record_fresh()  # a build of this content need not check again
        for problem in problems:
            print(f"stale: {problem}")
        up_to_date = "assignment/ and test cases are up to date"
        print(up_to_date if not problems else "run `python -m grader regen`")
        return 1 if problems else 0
    try:
        skeletons = skeleton.write()
    except skeleton.MarkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in skeletons:
        print(f"wrote {path.relative_to(skeleton.PROJECT_ROOT)}")
    parts = parse_parts(args.parts) if args.parts else None
    written = regen.write_cases(regen.TEST_CASES, parts=parts)
    for path in written:
        print(f"wrote {path.relative_to(regen.TEST_CASES.parent)}")
    if parts is None:
        record_fresh()  # every case written from this content: a build need not check
    return 0


def cmd_mutants(args: argparse.Namespace) -> int:
    from grader.ta.mutants import run_mutants

    names = [n.strip() for n in args.only.split(",") if n.strip()] or None
    verdicts = run_mutants(parse_parts(args.parts), names=names)
    for v in verdicts:
        if v.mutant.variant:
            outcome = "correct variant, full marks" if v.ok else "CORRECT VARIANT LOST POINTS"
        else:
            caught = "caught" if v.caught else "MISSED"
            outcome = f"{caught}, {'named' if v.named else 'NOT NAMED'}"
        print(f"{v.mutant.part}  {v.mutant.name:<30} {v.score:g}/{v.max_score:g}  {outcome}")
    mistakes = [v for v in verdicts if not v.mutant.variant]
    variants = [v for v in verdicts if v.mutant.variant]
    print(f"{sum(v.ok for v in mistakes)} of {len(mistakes)} mutants caught and named")
    if variants:
        print(f"{sum(v.ok for v in variants)} of {len(variants)} correct variants kept full marks")
    return 0 if all(v.ok for v in verdicts) else 1


def cmd_build(args: argparse.Namespace) -> int:
    from grader.ta.dist import StaleCases, build_autograder, build_student

    if args.what == "skeleton":
        return build_skeleton(Path(args.out) if args.out else None)
    builder = build_autograder if args.what == "autograder" else build_student
    out = Path(args.out or f"dist/{args.what}.zip")
    try:
        path = builder(out=out, check_cases=not args.skip_case_check)
    except StaleCases as exc:
        print(exc, file=sys.stderr)
        print("run `python -m grader regen` first", file=sys.stderr)
        return 1
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


def build_skeleton(out: Path | None) -> int:
    """Write the student skeletons (default ``assignment/``) from solution/'s markers."""
    from grader.ta import skeleton

    out = out or skeleton.ASSIGNMENT
    try:
        changed = skeleton.write(out)
    except skeleton.MarkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"wrote {path}")
    if not changed:
        print(f"{out} is up to date")
    return 0


def cmd_run_local(args: argparse.Namespace) -> int:
    """1 when the zip cannot be built or its set-up fails; else 0, whatever the score."""
    from grader.core.report import terminal_report
    from grader.ta.dist import StaleCases, build_autograder
    from grader.ta.run_local import IMAGE_VENV, KEPT_RESULTS, SetupFailed, run_local

    try:
        default = Path("dist/autograder.zip")
        zip_path = Path(args.zip) if args.zip else build_autograder(out=default, reuse=True)
        results, tree = run_local(
            submission=Path(args.submission),
            zip_path=zip_path,
            keep=args.keep,
            venv=Path(args.venv) if args.venv else IMAGE_VENV,
        )
    except StaleCases as exc:
        print(f"{exc}\nrun `python -m grader regen` first", file=sys.stderr)
        return 1
    except SetupFailed as exc:
        print(f"the autograder image could not be built: {exc}", file=sys.stderr)
        return 1
    print(terminal_report(results, details=args.details))
    print(f"results.json: {KEPT_RESULTS}  (reprint: .venv/bin/kvgrader show {KEPT_RESULTS})")
    if args.keep:
        print(f"Gradescope tree kept at {tree}")
    return 0


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
    run = dict(device=args.device, parts=parse_parts(args.parts), runs=args.runs)
    if cluster is None:
        main(**run, margin=args.margin, json_out=json_out)
        return 0
    try:
        return main_on_cluster(**run, margin=args.margin, json_out=json_out, cluster=cluster)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def add_regen(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("regen", help="regenerate assignment/ and test_cases/ from solution/")
    r.add_argument("--check", action="store_true", help="only report drift; exit 1 if stale")
    r.add_argument(
        "--parts", default="", help="regenerate (or check) only these parts (default: all)"
    )
    r.set_defaults(func=cmd_regen)


def add_mutants(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("mutants", help="grade the mutant library: is every known bug caught?")
    add_parts_option(m)
    m.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    m.set_defaults(func=cmd_mutants)


def add_build(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "build", help="build the Gradescope autograder zip, the student zip or the skeletons"
    )
    b.add_argument("what", choices=["autograder", "student", "skeleton"])
    b.add_argument(
        "--out", default="", help="zip path (default dist/<what>.zip); skeleton: assignment/"
    )
    b.add_argument("--skip-case-check", action="store_true", help=argparse.SUPPRESS)
    b.set_defaults(func=cmd_build)


def add_run_local(sub: argparse._SubParsersAction) -> None:
    lr = sub.add_parser("run-local", help="run the autograder zip on a submission as Gradescope")
    lr.add_argument("submission", help="folder holding the student's files")
    lr.add_argument(
        "--zip", default="", help="autograder zip (default: dist/autograder.zip, rebuilt if stale)"
    )
    lr.add_argument("--keep", action="store_true", help="keep the temporary /autograder tree")
    lr.add_argument("--details", action="store_true", help="print failed checks' feedback")
    lr.add_argument(
        "--venv", default="", help="where the image's virtual environment is kept (.image-venv)"
    )
    lr.set_defaults(func=cmd_run_local)


def add_calibrate(sub: argparse._SubParsersAction) -> None:
    ca = sub.add_parser(
        "calibrate", help="time the reference and a cache-free baseline; propose thresholds"
    )
    add_device_option(ca)
    add_parts_option(ca)
    ca.add_argument("--runs", type=int, default=5, help="graded runs of each (default 5)")
    ca.add_argument(
        "--margin", type=float, default=1.5, help="margin where no baseline is told apart"
    )
    ca.add_argument("--json", default="", help="also write the measurements to this file")
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

    from grader.core.report import terminal_report
    from grader.core.results import GradingResults, validate_results

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


#: The subcommands, in the order ``--help`` lists them.
COMMANDS = (
    add_grade, add_show, add_regen, add_mutants, add_build, add_run_local,
    partial(add_gradescope, listed=False),
    add_calibrate, add_batch, add_merge, add_similarity, add_reference_benchmarks,
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The parser; ``gradescope`` (what the zip's run_autograder calls) works but is not
    listed."""
    parser = argparse.ArgumentParser(
        prog="kvgrader",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
