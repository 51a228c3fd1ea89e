"""Check your work the way the autograder does, before you submit.

    python selfcheck.py                 # grades the files in assignment/
    python ../selfcheck.py              # the same, from inside assignment/
    python selfcheck.py path/to/folder  # or another folder
    python selfcheck.py assignment --parts part2   # or --parts 2

It runs the autograder's own checks on the public test data, with the same
messages and the same sandboxed worker. A few checks use cases only Gradescope
has (other weights, random inputs); each has a public counterpart here that runs
the same code on public data (listed at the end), so a submission that passes
every check here can lose points only to the hidden cases. Results go to
selfcheck_results.json; selfcheck_report.html shows the same feedback with pictures (your
Part 4 latency against L and Part 3 speedups beside the reference's, and where Part 2's
logits go wrong).

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

try:  # the parts' declarations (grader/ lies beside this script): plain data, read with
    # the standard library before the set-up is checked
    from grader.core.registry import PARTS
except ImportError:  # a Python before 3.11 (no tomllib): setup_problem() says so first
    PARTS = {}

HERE = Path(__file__).resolve().parent

#: Checks whose cases only Gradescope has -> the public checks that run the same code
#: with the same messages on public data (each part's table, grader/parts/<tag>/part.toml).
HIDDEN_COUNTERPARTS: dict[str, tuple[str, ...]] = {
    c.number: c.public_counterparts for part in PARTS.values() for c in part.checks if c.hidden
}
#: Checks run here too whose timed runs Gradescope also compares with the reference's
#: answers on hidden prompt pools; here they are timed on prompts of their own.
ANSWERS_COMPARED_ON_GRADESCOPE = tuple(
    c.number for part in PARTS.values() for c in part.checks if c.hidden_prompt_pools
)
#: What the grader imports; the first one missing means the set-up was skipped.
NEEDED = ("torch", "numpy", "transformers", "gradescope_utils", "jsonschema", "tiktoken")
#: The handout's set-up lines (README.md, "Set-up"), word for word: a test holds them equal.
SETUP_COMMANDS = (
    "python3.11 -m venv .venv",
    ". .venv/bin/activate",
    "python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu",
    "python -m pip install -r requirements.txt",
)
SETUP_HINT = (
    f"Set up first (README.md, 'Set-up'): in {HERE}, with Python 3.11,\n"
    + "".join(f"    {line}\n" for line in SETUP_COMMANDS)
    + "then run this script with that environment's python (python selfcheck.py)."
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
    """The hidden-case checks and the public checks that stand for them here ("" when
    the parts asked for have none)."""
    lines = []
    for hidden, public in HIDDEN_COUNTERPARTS.items():
        if parts is None or f"part{hidden.split('.')[0]}" in parts:
            lines.append(f"  {hidden:<5} <- {', '.join(public)}")
    if not lines:
        return ""
    return "\n".join(
        ["Checks with hidden cases (Gradescope only) and their public counterparts here:", *lines]
    )


PART_TAGS = tuple(PARTS)


def part_numbers() -> str:
    """The parts a student may ask for, as a sentence says them ("1, 2, 3 and 4")."""
    numbers = [str(p.number) for p in PARTS.values()]
    return " and ".join([", ".join(numbers[:-1]), numbers[-1]] if len(numbers) > 1 else numbers)


USAGE = (
    "usage: python selfcheck.py [FOLDER] [--parts PARTS] [--device cpu|cuda]\n"
    "  FOLDER   the folder with your files (default: the assignment/ beside selfcheck.py)\n"
    "  --parts  which parts to check, e.g. --parts 2 or --parts part2,part3 (default: all)\n"
    "  --device cpu: as Gradescope grades (default); cuda: the course's GPU benchmarks"
)
#: The grader options a student may pass on.
PASSED_ON = ("--parts", "--device")


def student_arguments(argv: list[str]) -> tuple[str, list[str], list[str], str]:
    """(folder, the grader's options, the part tags asked for, an error): ``--parts 4``
    is read as part4; anything else the self-check does not take is an error that
    shows its own usage (the grader's TA options are not for students). No folder is
    ``assignment``, read as :func:`folder_to_grade` reads it."""
    folder, options, tags = "assignment", [], []
    args = list(argv)
    if args and not args[0].startswith("-"):
        folder = args.pop(0)
    while args:
        name, _, value = args.pop(0).partition("=")
        if name not in PASSED_ON:
            return folder, options, tags, f"unknown argument {name!r}\n{USAGE}"
        if not value:
            if not args:
                return folder, options, tags, f"{name} needs a value\n{USAGE}"
            value = args.pop(0)
        if name == "--parts":
            asked = [t.strip() for t in value.split(",") if t.strip()]
            tags = [f"part{t}" if t.isdigit() else t for t in asked]
            unknown = [a for a, t in zip(asked, tags, strict=True) if t not in PART_TAGS]
            if unknown or not tags:
                return (
                    folder,
                    options,
                    tags,
                    f"unknown part {unknown or value!r}: "
                    + f"the parts are {part_numbers()}\n{USAGE}",
                )
            value = ",".join(tags)
        options += [name, value]
    if "--device" not in options:
        # Gradescope grades on its CPU, with the cpu profile: so does the self-check, on a
        # machine with a GPU too (the cuda profile's workloads are sized for a data-centre GPU).
        options += ["--device", "cpu"]
    return folder, options, tags, ""


def folder_to_grade(folder: str) -> Path:
    """The folder to grade: a folder the student named, from where they are; the default
    ``assignment`` is the one beside this script, wherever they run it from (the handout
    has them work inside ``assignment/``, so ``python ../selfcheck.py`` is natural)."""
    named = Path(folder)
    if folder == "assignment" and not named.is_dir():
        return HERE / "assignment"
    return named.resolve()


def points_note(results: Path, parts: list[str]) -> str:
    """How many of the selected parts' points this run could check, and which checks
    only Gradescope runs (their cases are hidden)."""
    import json

    from grader.core.points import POINTS

    try:
        ran = {t.get("number") for t in json.loads(results.read_text()).get("tests", [])}
    except (OSError, ValueError):
        return ""
    selected = {n: p for part in parts or PART_TAGS for n, p in POINTS[part].items()}
    only_there = [n for n in selected if n not in ran and n in HIDDEN_COUNTERPARTS]
    total = sum(selected.values())
    hidden = sum(selected[n] for n in only_there)
    compared = [n for n in ANSWERS_COMPARED_ON_GRADESCOPE if n in selected and n in ran]
    also = (
        f" On Gradescope, {', '.join(compared)} also compare your timed runs' answers with "
        "the reference's on hidden prompts."
        if compared
        else ""
    )
    if not only_there:
        return f"All {total:g} points of these checks are checked here.{also}"
    return (
        f"{total - hidden:g} of {total:g} points are checked here; {hidden:g} only on "
        f"Gradescope: {', '.join(only_there)}.{also}"
    )


def main(argv: list[str]) -> int:
    """Grade a folder with the public checks; returns the grader's exit status."""
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    problem = setup_problem()
    if problem:
        print(problem if problem == WINDOWS_HINT else f"{problem}\n{SETUP_HINT}", file=sys.stderr)
        return 2
    folder, options, parts, error = student_arguments(argv)
    if error:
        print(error, file=sys.stderr)
        return 2
    results = HERE / "selfcheck_results.json"
    command = [
        sys.executable, "-m", "grader.grading", "grade", str(folder_to_grade(folder)),
        "--results", str(results), "--table", "--details", "--public-only", *options,
        "--report", str(HERE / "selfcheck_report.html"),
        "--reference", str(HERE / "reference_benchmarks.json"),
    ]  # fmt: skip
    print("Public test data only: the hidden cases run on Gradescope.\n", flush=True)
    status = subprocess.call(command, cwd=HERE)
    if status == 0:
        for note in (points_note(results, parts), counterpart_note(parts or None)):
            if note:
                print(f"\n{note}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
