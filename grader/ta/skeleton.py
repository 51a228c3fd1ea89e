"""The student skeletons in ``assignment/``, generated from the annotated ``solution/``.

The solution is the one source: provided code (the tokenizer, the harnesses, every
line outside a TODO) exists there only, and ``assignment/`` is what this module
makes of it. Each ``.py`` file of ``solution/`` may carry regions marked with
whole-line comments, in the style of otter-grader's ``otter assign`` and nbgrader::

    def weight_bytes(spec: ModelSpec) -> int:
        # BEGIN SOLUTION
        return param_count(spec) * spec.bytes_per_param
        # END SOLUTION
        # BEGIN PROMPT
        # # TODO: Parameters times bytes per parameter.
        # raise NotImplementedError("weight_bytes")
        # END PROMPT

* ``# BEGIN SOLUTION`` ... ``# END SOLUTION``: the lines between are the solution's
  only; the skeleton drops them, markers included.
* ``# BEGIN PROMPT`` ... ``# END PROMPT``: the lines between are the skeleton's only.
  In the solution each is commented out: the skeleton's line with ``# `` written
  after its indentation (a bare ``#`` is an empty line). The skeleton gets the
  line back without it. Being comments, prompts never run, never reach the
  solution's docstrings and leave ruff, import order and the mutant library alone.
  A prompt usually follows the solution region it replaces; it may stand alone
  (a note to students under a module docstring).

Regions do not nest. Everything else is copied unchanged, and so is every file
without markers, so provided files are byte-identical. A malformed region (a
BEGIN never closed, an END without a BEGIN, nested regions, a prompt line that is
not a comment, a misspelt marker) is a :class:`MarkerError` naming file and line.

``assignment/`` stays committed (students and the design card link to it);
:func:`check` reports it stale when it differs from what the solution generates.
Files of ``assignment/`` that have no counterpart in the solution are listed in
``STUDENT_ONLY`` (the handout); anything else there is reported.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from pathlib import Path

from grader.core.paths import ASSIGNMENT, PROJECT_ROOT, SOLUTION  # noqa: F401  (PROJECT_ROOT: the CLI's messages)

#: Files of ``assignment/`` written by hand, not generated: the handout.
STUDENT_ONLY = ("README.md",)
#: Never sources: caches, plots and outputs that running the code leaves behind.
IGNORED = ("__pycache__", "*.pyc", ".DS_Store", "*.png", "results", "benchmark_results.json")

_MARKER = re.compile(r"#\s*(BEGIN|END)\s+(SOLUTION|PROMPT)\b", re.IGNORECASE)


class MarkerError(ValueError):
    """A malformed solution/prompt region, with the file and line where it was found."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line = path, line


def _marker(line: str, path: str, number: int) -> tuple[str, str] | None:
    """``("BEGIN", "SOLUTION")`` etc. for a marker line, None for any other line."""
    stripped = line.strip()
    found = _MARKER.match(stripped)
    if found is None:
        return None
    action, kind = found.group(1), found.group(2)
    if stripped != f"# {action} {kind}":
        raise MarkerError(path, number, f"malformed marker {stripped!r}: write '# {action} {kind}'")
    return action, kind


def strip_solution(text: str, path: str = "<text>") -> str:
    """The skeleton's version of one annotated solution file (see the module docstring).

    ``path`` only names the file in a :class:`MarkerError`.
    """
    out: list[str] = []
    open_kind: str | None = None
    opened_at = 0
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        marker = _marker(line, path, number)
        if marker is not None:
            action, kind = marker
            if action == "BEGIN":
                if open_kind is not None:
                    raise MarkerError(
                        path,
                        number,
                        f"BEGIN {kind} inside the {open_kind} region opened at line "
                        f"{opened_at} (regions do not nest)",
                    )
                open_kind, opened_at = kind, number
            elif open_kind is None:
                raise MarkerError(path, number, f"END {kind} without a BEGIN {kind}")
            elif kind != open_kind:
                raise MarkerError(
                    path,
                    number,
                    f"END {kind} closes the {open_kind} region opened at line {opened_at}",
                )
            else:
                open_kind = None
        elif open_kind is None:
            out.append(line)
        elif open_kind == "PROMPT":
            out.append(_uncomment(line, path, number))
    if open_kind is not None:
        raise MarkerError(path, opened_at, f"BEGIN {open_kind} is never closed")
    return "".join(out)


def _uncomment(line: str, path: str, number: int) -> str:
    """A prompt line as the skeleton has it: ``<indent># text`` -> ``<indent>text``."""
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    indent = body[: len(body) - len(body.lstrip())]
    rest = body[len(indent) :]
    if rest == "" or rest == "#":
        return ending
    if not rest.startswith("# "):
        raise MarkerError(
            path, number, "a prompt line must be a comment: '# ' and then the skeleton's line"
        )
    return (indent + rest[2:]).rstrip() + ending


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in IGNORED)


def source_files(root: Path) -> Iterator[Path]:
    """Every file under ``root`` but the ``IGNORED`` ones, sorted."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not any(_ignored(part) for part in rel.parts):
            yield path


def generate(solution: Path | None = None) -> dict[str, bytes]:
    """Every skeleton file, by path relative to ``assignment/``, from ``solution``
    (default ``solution/``).

    Python files lose their solution regions and gain their prompts; other files
    are copied as they are.
    """
    solution = solution or SOLUTION
    files: dict[str, bytes] = {}
    for path in source_files(solution):
        rel = path.relative_to(solution).as_posix()
        data = path.read_bytes()
        if path.suffix == ".py":
            name = (Path(solution.name) / rel).as_posix()
            data = strip_solution(data.decode("utf-8"), name).encode("utf-8")
        files[rel] = data
    return files


def write(out: Path | None = None, solution: Path | None = None) -> list[Path]:
    """Write the skeletons into ``out`` (default ``assignment/``); return the files whose
    content changed.

    Nothing is deleted: a file of ``out`` that the solution no longer generates is
    reported by :func:`check`. Nothing is written when a marker is malformed.
    """
    out = out or ASSIGNMENT
    changed = []
    for rel, data in generate(solution).items():
        target = out / rel
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        changed.append(target)
    return changed


def check(assignment: Path | None = None, solution: Path | None = None) -> list[str]:
    """Every way ``assignment`` differs from what ``solution`` generates (empty: fresh);
    by default ``assignment/`` and ``solution/``."""
    assignment = assignment or ASSIGNMENT
    try:
        fresh = generate(solution)
    except (MarkerError, UnicodeDecodeError) as exc:
        return [f"cannot generate the skeletons: {exc}"]
    name = assignment.name
    problems = []
    for rel, data in fresh.items():
        committed = assignment / rel
        if not committed.is_file():
            problems.append(f"{name}/{rel}: missing (generated from solution/{rel})")
        elif committed.read_bytes() != data:
            line = _first_difference(committed.read_bytes(), data)
            problems.append(
                f"{name}/{rel}: differs from what solution/{rel} generates (from line {line})"
            )
    for path in source_files(assignment):
        rel = path.relative_to(assignment).as_posix()
        if rel not in fresh and rel not in STUDENT_ONLY:
            problems.append(
                f"{name}/{rel}: not generated from solution/ and not a student-only file "
                f"(grader/ta/skeleton.py, STUDENT_ONLY)"
            )
    return problems


def _first_difference(a: bytes, b: bytes) -> int:
    """The 1-based number of the first line where ``a`` and ``b`` differ."""
    for number, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False), start=1):
        if x != y:
            return number
    return min(len(a.splitlines()), len(b.splitlines())) + 1
