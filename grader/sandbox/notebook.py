"""A lab handed in as a Jupyter notebook, graded as the script it defines.

The course's lab handout asks for "your Python notebook (.ipynb) or script file (.py)". A
notebook runs its experiments at the top level, cell after cell: imported as a module, it
would load models and time every L before the grader asked it anything. So the grader
keeps what the notebook defines, from every code cell in order: its imports, functions and
classes, and the assignments those use (a ``DEVICE = ...`` that a default argument reads);
the other top-level statements are not run, as ``if __name__ == "__main__":`` leaves a
script's. IPython's magics and shell lines (``%timeit``, ``!pip install``) are not Python
and are left out.

The notebook is parsed here, in the grader, and never run: its code runs only in the
worker, as the written script.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

MAX_NOTEBOOK_BYTES = 20 * 2**20  # outputs included (plots are stored in the notebook)
TOO_LARGE = f"it is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
#: Python source in all code cells together. A lab's code is tens of KiB. The grader's
#: syntax trees of 0.9 MiB of one-line assignments peaked at 160 MiB, and those of 18 MiB
#: at 2.7 GB, past Gradescope's memory: the grading would have died unreported.
MAX_CODE_BYTES = 2**20
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
ASSIGNMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


class NotebookError(ValueError):
    """The notebook cannot be read as one: the message says why, for the student."""


@dataclass
class Converted:
    """The script written from a notebook, and what was left out of it."""

    script: str
    kept: int  # top-level statements kept (imports, definitions, assignments they use)
    not_run: int  # top-level statements left out
    magics: int  # IPython lines (magics, shell commands) left out
    broken_cells: list[int]  # code cells (numbered from 1) that are not valid Python

    def summary(self) -> str:
        """One clause for the results page."""
        parts = [f"kept {self.kept} imports, definitions and the values they read"]
        if self.not_run:
            parts.append(f"not run: {_count(self.not_run, 'other top-level statement')}")
        if self.magics:
            parts.append(f"left out: {_count(self.magics, 'IPython line')}")
        if self.broken_cells:
            cells = ", ".join(str(n) for n in self.broken_cells)
            parts.append(f"left out as not valid Python: code cell(s) {cells}")
        return "; ".join(parts)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def code_cells(text: str) -> list[str]:
    """The source of every code cell of a notebook (nbformat 4), in order."""
    try:
        notebook = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise NotebookError(f"it is not a notebook file (not valid JSON: {exc})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise NotebookError("it has no cells: save it again from Jupyter (notebook format 4)")
    sources = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        sources.append(source if isinstance(source, str) else "")
    return sources


def _without_magics(source: str) -> tuple[str, int]:
    """The cell with its IPython lines blanked (line numbers kept), and how many there were.
    A cell magic (``%%time``) makes the whole cell IPython's."""
    lines = source.split("\n")
    if source.lstrip().startswith("%%"):
        return "", sum(1 for line in lines if line.strip())
    magics = 0
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("%", "!")):
            lines[i], magics = "", magics + 1
    return "\n".join(lines), magics


def _loaded_names(node: ast.AST) -> set[str]:
    """The global names ``node`` may read: for a function or class, the names it reads
    less its parameters and the names it assigns (its locals), so that a function's own
    ``model`` does not keep a top-level ``model = load_model()``."""
    names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {n.id for n in names}
    local = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
    local |= {n.id for n in names if isinstance(n.ctx, (ast.Store, ast.Del))}
    return {n.id for n in names if isinstance(n.ctx, ast.Load)} - local


def _assigned_names(node: ast.AST) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _kept(nodes: list[ast.stmt]) -> set[int]:
    """Indices of the statements a module made of ``nodes`` keeps: every definition, and
    every assignment to a name that something kept reads, to a fixpoint. Each statement's
    names are read once and each name is followed once, so a notebook's size, not the
    length of a chain of assignments in it, bounds the work."""
    kept = {i for i, node in enumerate(nodes) if isinstance(node, DEFINITIONS)}
    assigning: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if isinstance(node, ASSIGNMENTS):
            for name in _assigned_names(node):
                assigning.setdefault(name, []).append(i)
    todo = [name for i in sorted(kept) for name in _loaded_names(nodes[i])]
    followed: set[str] = set()
    while todo:
        name = todo.pop()
        if name in followed:
            continue
        followed.add(name)
        for i in assigning.get(name, ()):
            if i not in kept:
                kept.add(i)
                todo += _loaded_names(nodes[i])
    return kept


def _is_future(node: ast.stmt) -> bool:
    """A ``from __future__ import ...``: hoisted to the script's top, where it must be."""
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def script_from_notebook(text: str, name: str) -> Converted:
    """The script a notebook defines (see the module's docstring); ``name`` is the
    notebook's file name, for the script's header."""
    if len(text.encode()) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(TOO_LARGE)
    cells: list[tuple[int, list[str], list[ast.stmt]]] = []
    magics, broken = 0, []
    sources = code_cells(text)
    code_bytes = sum(len(source.encode()) for source in sources)
    if code_bytes > MAX_CODE_BYTES:
        raise NotebookError(
            f"its code cells hold {code_bytes / 2**20:.1f} MiB of Python, more than the "
            f"{MAX_CODE_BYTES // 2**20} MiB a lab's notebook may have: keep data in files, "
            "not in cells, or hand in the script"
        )
    for number, source in enumerate(sources, start=1):
        source, found = _without_magics(source)
        magics += found
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            broken.append(number)
            continue
        cells.append((number, source.split("\n"), tree.body))
    nodes = [node for _, _, body in cells for node in body]
    kept = _kept(nodes)
    future = [n for n in nodes if _is_future(n)]
    out = [
        f"# Written by the grader from {name}: the notebook's imports, definitions and the",
        "# assignments they use, cell by cell. Its other top-level statements were not run.",
        *sorted({ast.unparse(n) for n in future}),
    ]
    index = 0
    for number, lines, body in cells:
        segments = []
        for node in body:
            if index in kept and not _is_future(node):
                first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
                segments.append("\n".join(lines[first - 1 : node.end_lineno]))
            index += 1
        if segments:
            out += ["", f"# --- code cell {number}", *segments]
    return Converted("\n".join(out) + "\n", len(kept), len(nodes) - len(kept), magics, broken)
