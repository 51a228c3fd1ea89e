"""Check your work the way the autograder does, before you submit.

    python selfcheck.py                 # grades the files in assignment/
    python selfcheck.py path/to/folder  # or another folder
    python selfcheck.py assignment --parts part2

It runs the autograder's own public checks, with the same messages and the same
sandboxed worker. The hidden checks (other models, random cases) run only on
Gradescope, so they are not listed here. Results go to selfcheck_results.json.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    folder = argv[0] if argv and not argv[0].startswith("-") else "assignment"
    rest = argv[1:] if argv and not argv[0].startswith("-") else argv
    command = [
        sys.executable, "-m", "grader", "grade", str(Path(folder).resolve()),
        "--results", str(HERE / "selfcheck_results.json"),
        "--table", "--details", "--public-only", *rest,
    ]  # fmt: skip
    print("Public checks only: the hidden ones run on Gradescope.\n", flush=True)
    return subprocess.call(command, cwd=HERE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
