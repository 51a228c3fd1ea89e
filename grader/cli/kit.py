"""The TA's subcommands that make and check the kit (regen, mutants, build, run-local),
apart from :mod:`grader.cli`'s parser so that each module holds one group of subcommands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.core.registry import parse_parts
from grader.grading.commands import add_parts_option


def cmd_regen(args: argparse.Namespace) -> int:
    """assignment/ from solution/'s markers, then test_cases/; ``--check`` only compares."""
    from grader.ta import handout, regen, skeleton
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
    if handout.write_tables():
        skeletons.append(handout.HANDOUT)
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
    from grader.core.terminal import terminal_report
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
