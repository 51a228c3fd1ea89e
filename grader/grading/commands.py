"""The grading commands, shared by the TA's CLI (``python -m grader``) and the zips'
entry point (``python -m grader.grading``): each subcommand is a thin wrapper over a
keyword-only function, with its defaults written once, here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.core.registry import parse_parts

DEFAULT_RESULTS = "results/results.json"
GRADESCOPE_ROOT = "/autograder"


def add_parts_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default="", help="comma-separated part tags (default: all)")


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the submission runs and which benchmark profile applies "
        "(default: cuda when torch sees a GPU, else cpu)",
    )


def add_tags_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tags", default="", help="only checks with one of these tags, e.g. benchmark"
    )


def tag_set(text: str) -> frozenset[str] | None:
    """``"benchmark,timed"`` -> the tags; ``""`` -> None (every check)."""
    return frozenset(t.strip() for t in text.split(",") if t.strip()) or None


def cmd_grade(args: argparse.Namespace) -> int:
    from grader.core.terminal import terminal_report
    from grader.grading.runner import grade

    if not Path(args.submission).is_dir():  # a typo, not a submission that scores 0
        print(f"error: {args.submission} is not a folder; nothing was graded", file=sys.stderr)
        return 2
    results = grade(
        Path(args.submission),
        results_path=Path(args.results),
        parts=parse_parts(args.parts),
        device=args.device,
        public_only=args.public_only,
        tags=tag_set(args.tags),
        hide=tuple(Path(h) for h in args.hide),
    )
    if args.report:
        from grader.grading.selfcheck_page import write_report

        reference = Path(args.reference) if args.reference else None
        page = write_report(Path(args.results), Path(args.report), reference)
        print(f"report with pictures: {page}")
    if results is None:
        print(f"grading failed; a fallback results file was written to {args.results}")
        return 0
    if args.table:  # the feedback as text, as `show` reprints it; a public-only grading is
        # the self-check, whose advice never says to run what was just run
        print(terminal_report(results, details=args.details, local=args.public_only))
        failed = sum(t.status == "failed" for t in results.tests)
        if failed and not args.details:
            print(f"{failed} check(s) failed: `{this_python()} -m grader show {args.results}` "
                  "prints their feedback as Gradescope words it (or grade again with "
                  "--details)")  # fmt: skip
    print(f"results written to {args.results}")
    return 0


def this_python() -> str:
    """The interpreter running the grader, as a TA can type it (``.venv/bin/python`` from
    the checkout): the shell's ``python`` may be another one, without the grader's
    packages."""
    here = Path(sys.executable)
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


def add_grade(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("grade", help="grade one submission folder")
    g.add_argument("submission", help="folder holding the student's files")
    g.add_argument("--results", default=DEFAULT_RESULTS, help="where to write results")
    add_parts_option(g)
    add_device_option(g)
    add_tags_option(g)
    g.add_argument(
        "--hide",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder the submission's code must not see (repeatable; batch hides its export)",
    )
    g.add_argument("--table", action="store_true", help="print a score table")
    g.add_argument("--details", action="store_true", help="with --table: print failed feedback")
    g.add_argument(
        "--public-only", action="store_true", help="leave out the hidden-case checks (self-check)"
    )
    g.add_argument("--report", metavar="HTML", help="also write an HTML report with pictures")
    g.add_argument(
        "--reference", metavar="JSON", help="with --report: the reference's benchmark records"
    )
    g.set_defaults(func=cmd_grade)


def cmd_gradescope(args: argparse.Namespace) -> int:
    from grader.grading.autograder import main as autograde

    return autograde(root=Path(args.root), parts=parse_parts(args.parts))


def add_gradescope(sub: argparse._SubParsersAction, *, listed: bool = True) -> None:
    """``gradescope``: what run_autograder calls inside Gradescope (``listed``: whether
    ``--help`` names it; the TA's CLI keeps it working but unlisted)."""
    about = {"help": "what run_autograder calls inside Gradescope"} if listed else {}
    gs = sub.add_parser("gradescope", **about)
    gs.add_argument("--root", default=GRADESCOPE_ROOT, help="the Gradescope tree")
    add_parts_option(gs)
    gs.set_defaults(func=cmd_gradescope)


def run(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse ``argv`` and run the chosen subcommand; a bad value is a usage error (2)."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # bad command-line values (e.g. an unknown part)
        parser.error(str(exc))
    return 2
