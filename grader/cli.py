"""``python -m grader``: one command, thin subcommands over keyword-only functions."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.parts import parse_parts


def cmd_grade(args: argparse.Namespace) -> int:
    from grader.report import failure_details, score_table
    from grader.runner import grade

    results = grade(
        Path(args.submission),
        results_path=Path(args.results),
        parts=parse_parts(args.parts),
        device=args.device,
    )
    if results is None:
        print(f"grading failed; a fallback results file was written to {args.results}")
        return 0
    if args.table:
        print(score_table(results))
        if args.details:
            details = failure_details(results)
            if details:
                print("\n" + details)
    print(f"results written to {args.results}")
    return 0


def cmd_regen(args: argparse.Namespace) -> int:
    from grader import regen

    if args.check:
        problems = regen.check()
        for problem in problems:
            print(f"stale: {problem}")
        print("test cases are up to date" if not problems else "run `python -m grader regen`")
        return 1 if problems else 0
    written = regen.write_cases(regen.TEST_CASES)
    for path in written:
        print(f"wrote {path.relative_to(regen.TEST_CASES.parent)}")
    return 0


def cmd_mutants(args: argparse.Namespace) -> int:
    from grader.mutants import run_mutants

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("grade", help="grade one submission folder")
    g.add_argument("submission", help="folder holding the student's files")
    g.add_argument("--results", default="results/results.json", help="where to write results")
    g.add_argument("--parts", default="", help="comma-separated part tags (default: all)")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    g.add_argument("--table", action="store_true", help="print a score table")
    g.add_argument("--details", action="store_true", help="with --table: print failed feedback")
    g.set_defaults(func=cmd_grade)

    r = sub.add_parser("regen", help="regenerate test_cases/ from solution/")
    r.add_argument("--check", action="store_true", help="only report drift; exit 1 if stale")
    r.set_defaults(func=cmd_regen)

    m = sub.add_parser("mutants", help="grade the mutant library: is every known bug caught?")
    m.add_argument("--parts", default="", help="comma-separated part tags (default: all)")
    m.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    m.set_defaults(func=cmd_mutants)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # bad command-line values (e.g. an unknown part)
        parser.error(str(exc))
    return 2


if __name__ == "__main__":
    sys.exit(main())
