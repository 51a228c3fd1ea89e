"""``python -m grader`` (``.venv/bin/kvgrader``): the TA's command line. Each subcommand
is a thin wrapper over a keyword-only function; what ``--help`` says is :data:`DESCRIPTION`,
written for a TA. Here the parser; the subcommands by group in :mod:`grader.cli.kit`,
:mod:`grader.cli.submissions` and :mod:`grader.cli.calibration` (``grade`` and
``gradescope`` in :mod:`grader.grading.commands`)."""

from __future__ import annotations

import argparse
from functools import partial

from grader import DESCRIPTION, EPILOG, version
from grader.cli.calibration import add_calibrate, add_reference_benchmarks
from grader.cli.kit import add_build, add_mutants, add_regen, add_run_local
from grader.cli.submissions import add_batch, add_merge, add_show, add_similarity
from grader.grading.commands import add_grade, add_gradescope, run

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
