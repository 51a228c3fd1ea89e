"""``python -m grader.grading``: the entry point of both zips (Gradescope's
``run_autograder`` and the student's ``selfcheck.py``); it needs nothing of ``grader.ta``."""

from __future__ import annotations

import argparse
import sys

from grader.grading.commands import add_grade, add_gradescope, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader.grading", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_grade(sub)
    add_gradescope(sub)
    return parser


if __name__ == "__main__":
    sys.exit(run(build_parser(), sys.argv[1:]))
