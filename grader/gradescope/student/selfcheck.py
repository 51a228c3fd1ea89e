"""Check your work the way the autograder does, before you submit.

    python selfcheck.py                 # grades the files in assignment/
    python selfcheck.py path/to/folder  # or another folder
    python selfcheck.py assignment --parts part2

It runs the autograder's own checks on the public test data, with the same
messages and the same sandboxed worker. A few checks use cases only Gradescope
has (other weights, random inputs); each has a public counterpart here that runs
the same code on public data (listed at the end), so a submission that passes
every check here can lose points only to the hidden cases. Results go to
selfcheck_results.json.

Part 1's public cases are the write-up's questions, so this folder holds their
answers sealed, not in plain form: a check says whether your value is right (and
names a known mistake), never what the right value is.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Checks whose cases only Gradescope has -> the public checks that run the same code
#: with the same messages on public data.
HIDDEN_COUNTERPARTS: dict[str, tuple[str, ...]] = {
    "1.12": ("1.1", "1.2", "1.3", "1.4", "1.5"),  # the memory functions on random specs
    "1.13": ("1.6", "1.7", "1.8"),  # the attention functions on random shapes
    "2.6": ("2.2",),  # logits without the cache, another model
    "2.7": ("2.3", "2.4", "2.5"),  # logits with the cache, another model
    "3.4": ("3.2", "3.3"),  # forward with and without the cache, another model
    "3.9": ("3.5",),  # greedy generation, another model
}
#: What the grader imports; the first one missing means the set-up was skipped.
NEEDED = ("torch", "numpy", "transformers", "gradescope_utils", "jsonschema", "tiktoken")
SETUP_HINT = (
    "Set up first (README.md, 'Set-up'): in this folder, with Python 3.11 or newer,\n"
    "    python3 -m venv .venv && . .venv/bin/activate\n"
    "    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu\n"
    "    pip install -r requirements.txt\n"
    "then run this script with that environment's python."
)


WINDOWS_HINT = (
    "The self-check runs your code in a sandbox that needs Linux or macOS; on Windows, "
    "open WSL (the Windows Subsystem for Linux), unzip the assignment there and follow "
    "README.md's set-up inside it."
)


def setup_problem() -> str:
    """Why this interpreter cannot run the grader ("" when it can)."""
    if os.name == "nt":
        return WINDOWS_HINT
    if sys.version_info < (3, 11):  # noqa: UP036  (a student may run any python3)
        return f"This is Python {sys.version.split()[0]}; the assignment needs 3.11 or newer."
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        return f"{sys.executable} lacks {', '.join(missing)}."
    return ""


def counterpart_note(parts: list[str] | None = None) -> str:
    """The hidden-case checks and the public checks that stand for them here."""
    lines = ["Checks with hidden cases (Gradescope only) and their public counterparts here:"]
    for hidden, public in HIDDEN_COUNTERPARTS.items():
        if parts is None or f"part{hidden.split('.')[0]}" in parts:
            lines.append(f"  {hidden:<5} <- {', '.join(public)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Grade a folder with the public checks; returns the grader's exit status."""
    problem = setup_problem()
    if problem:
        print(problem if problem == WINDOWS_HINT else f"{problem}\n{SETUP_HINT}", file=sys.stderr)
        return 2
    folder = argv[0] if argv and not argv[0].startswith("-") else "assignment"
    rest = argv[1:] if argv and not argv[0].startswith("-") else argv
    command = [
        sys.executable, "-m", "grader.grading", "grade", str(Path(folder).resolve()),
        "--results", str(HERE / "selfcheck_results.json"),
        "--table", "--details", "--public-only", *rest,
    ]  # fmt: skip
    print("Public test data only: the hidden cases run on Gradescope.\n", flush=True)
    status = subprocess.call(command, cwd=HERE)
    parts = [p for i, a in enumerate(rest[:-1]) if a == "--parts" for p in rest[i + 1].split(",")]
    print(f"\n{counterpart_note(parts or None)}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
