"""A lab handed in as a Jupyter notebook, graded as the script it defines.

The course's lab handout asks for "your Python notebook (.ipynb) or script file (.py)". A
notebook runs its experiments at the top level, cell after cell: imported as a module, it
would load models and time every L before the grader asked it anything. So the grader
keeps what the notebook defines, from every code cell in order: its imports, functions and
classes, and the assignments those use (a ``DEVICE = ...`` that a default argument reads);
the other top-level statements are not run, as ``if __name__ == "__main__":`` leaves a
script's. IPython's magics and shell lines (``%timeit``, ``!pip install``) are not Python
and are left out.

Each kept statement is written as its exact span in the cell (the syntax tree's start and
end, to the column), never as the whole lines it is on: ``import os; os.remove(...)``
keeps ``import os`` only, and a statement left out that shares a line with a kept one is
named on the page.

The notebook is read and parsed in a child process with limits of its own, never in the
grader (:mod:`grader.sandbox.notebook_child` starts it, as the worker account when the
grader is root): this module is that child's whole program, the standard library only,
sent to a bare interpreter as its source (:func:`serve`). Its code is never run: it runs
only in the worker, as the written script.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import sys
from dataclasses import asdict, dataclass, field

MAX_NOTEBOOK_BYTES = 20 * 2**20  # outputs included (plots are stored in the notebook)
TOO_LARGE = f"it is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
#: Python source in all code cells together. A lab's code is tens of KiB. The grader's
#: syntax trees of 0.9 MiB of one-line assignments peaked at 160 MiB, and those of 18 MiB
#: at 2.7 GB, past Gradescope's memory: the grading would have died unreported.
MAX_CODE_BYTES = 2**20
#: The script written: the kept statements (at most the code above) and a line naming each
#: cell they came from, so a few MiB at most; the child's output file is limited to it.
MAX_SCRIPT_BYTES = 8 * 2**20
#: The statements left out that shared a line with a kept one, named on the page.
NAMED_SHARED = 5
#: The child's exit statuses when it ran out of memory (its address space is limited) and
#: when its output went past its limit (Python ignores SIGXFSZ: the write fails).
EXIT_MEMORY, EXIT_OUTPUT = 86, 87
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
    #: Left-out statements on a line with a kept one (``import os; os.remove(...)``), each
    #: as ``'its source' (code cell N, line L)``: a student reading the line would think
    #: it ran.
    shared_line: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One clause for the results page."""
        parts = [f"kept {self.kept} imports, definitions and the values they read"]
        if self.not_run:
            parts.append(f"not run: {_count(self.not_run, 'other top-level statement')}")
        if self.shared_line:
            named = ", ".join(self.shared_line[:NAMED_SHARED])
            more = len(self.shared_line) - NAMED_SHARED
            named += f" and {more} more" if more > 0 else ""
            parts[-1] += (
                f", among them {len(self.shared_line)} on a line with a kept statement "
                f"(only whole statements are kept): {named}"
            )
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


@dataclass
class _Cell:
    """A code cell that parsed: its number, its lines (UTF-8, as the syntax tree's
    columns count) and its top-level statements."""

    number: int
    lines: list[bytes]
    body: list[ast.stmt]

    def start(self, node: ast.stmt) -> tuple[int, int]:
        """Where ``node``'s source begins (line from 1, byte column): its first
        decorator's ``@`` for a decorated definition. A decorated definition is a compound
        statement, so its ``@`` begins a line of its own: the nearest line above the
        first decorator that starts with one (a ``@`` alone on a line ends with ``\\``)."""
        decorators = getattr(node, "decorator_list", [])
        if not decorators:
            return node.lineno, node.col_offset
        line = decorators[0].lineno
        while line > 1 and not self.lines[line - 1].lstrip(b" \t\f").startswith(b"@"):
            line -= 1
        text = self.lines[line - 1]
        return line, len(text) - len(text.lstrip(b" \t\f"))

    def span(self, node: ast.stmt) -> str:
        """``node``'s exact source: from its start to its end column, so nothing else on
        its first or last line (a statement after a ``;``) comes with it."""
        (first, col), last = self.start(node), node.end_lineno or node.lineno
        end_col = node.end_col_offset if node.end_col_offset is not None else None
        if first == last:
            return self.lines[first - 1][col:end_col].decode()
        middle = self.lines[first : last - 1]
        text = [self.lines[first - 1][col:], *middle, self.lines[last - 1][:end_col]]
        return b"\n".join(text).decode()

    def rows(self, node: ast.stmt) -> range:
        """The lines ``node`` is on."""
        return range(self.start(node)[0], (node.end_lineno or node.lineno) + 1)


def _parsed_cells(sources: list[str]) -> tuple[list[_Cell], int, list[int]]:
    """Each code cell's statements, less its IPython lines; how many of those there were,
    and which cells are not valid Python. Line ends are made ``\\n`` first, as Python's
    own reading of source makes them, so that lines here are the syntax tree's lines."""
    cells, magics, broken = [], 0, []
    for number, source in enumerate(sources, start=1):
        source, found = _without_magics(source.replace("\r\n", "\n").replace("\r", "\n"))
        magics += found
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError):
            broken.append(number)
            continue
        cells.append(_Cell(number, source.encode().split(b"\n"), tree.body))
    return cells, magics, broken


def _shown(text: str) -> str:
    """A statement's source as the page names it: its first line, cut short, quoted."""
    line = text.split("\n", 1)[0]
    return repr(line if len(line) <= 60 and "\n" not in text else line[:57] + "...")


def _refuse_large_code(sources: list[str]) -> None:
    code_bytes = sum(len(source.encode()) for source in sources)
    if code_bytes > MAX_CODE_BYTES:
        raise NotebookError(
            f"its code cells hold {code_bytes / 2**20:.1f} MiB of Python, more than the "
            f"{MAX_CODE_BYTES // 2**20} MiB a lab's notebook may have: keep data in files, "
            "not in cells, or hand in the script"
        )


def script_from_notebook(text: str, name: str) -> Converted:
    """The script a notebook defines (see the module's docstring); ``name`` is the
    notebook's file name, for the script's header."""
    if len(text.encode()) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(TOO_LARGE)
    sources = code_cells(text)
    _refuse_large_code(sources)
    cells, magics, broken = _parsed_cells(sources)
    nodes = [node for cell in cells for node in cell.body]
    kept = _kept(nodes)
    out = [
        f"# Written by the grader from {name}: the notebook's imports, definitions and the",
        "# assignments they use, cell by cell. Its other top-level statements were not run.",
        *sorted({ast.unparse(n) for n in nodes if _is_future(n)}),
    ]
    shared: list[str] = []
    index = 0
    for cell in cells:
        chosen = [(n, index + i in kept) for i, n in enumerate(cell.body)]
        index += len(cell.body)
        kept_rows = {row for n, keep in chosen if keep for row in cell.rows(n)}
        for node, keep in chosen:
            if not keep and kept_rows.intersection(cell.rows(node)):
                where = f"code cell {cell.number}, line {cell.start(node)[0]}"
                shared.append(f"{_shown(cell.span(node))} ({where})")
        segments = [cell.span(n) for n, keep in chosen if keep and not _is_future(n)]
        if segments:
            out += ["", f"# --- code cell {cell.number}", *segments]
    script = "\n".join(out) + "\n"
    if len(script.encode()) > MAX_SCRIPT_BYTES:
        raise NotebookError(
            f"the script it defines is larger than {MAX_SCRIPT_BYTES // 2**20} MiB: "
            "hand in the script"
        )
    return Converted(script, len(kept), len(nodes) - len(kept), magics, broken, shared)


# ----------------------------------------------------------------------- the child


def _limit(kind: int, value: int, hard: int | None = None) -> None:
    """Lower one of the child's limits to ``value`` (soft) and ``hard``, never above the
    hard limit it was started with (a TA's ``ulimit -v`` below ours stays)."""
    hard = value if hard is None else hard
    _, ceiling = resource.getrlimit(kind)
    if ceiling != resource.RLIM_INFINITY:
        value, hard = min(value, ceiling), min(hard, ceiling)
    resource.setrlimit(kind, (value, hard))


def serve(argv: list[str]) -> int:
    """The child's program (``argv``: its memory in bytes, CPU seconds, largest output and
    the notebook's name). Its limits are set before anything of the notebook is read;
    the notebook comes on stdin, and stdout gets one line of JSON, ``{"converted": ...}``
    without the script or ``{"error": why}``, then the script. Out of memory it exits
    with :data:`EXIT_MEMORY`, past its output limit with :data:`EXIT_OUTPUT`."""
    memory, cpu, output = (int(a) for a in argv[:3])
    _limit(resource.RLIMIT_AS, memory)
    _limit(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU, then SIGKILL a second later
    _limit(resource.RLIMIT_FSIZE, output)
    _limit(resource.RLIMIT_CORE, 0)
    script = b""
    try:
        data = sys.stdin.buffer.read(MAX_NOTEBOOK_BYTES + 1)
        if len(data) > MAX_NOTEBOOK_BYTES:
            raise NotebookError(TOO_LARGE)
        text = data.decode("utf-8-sig")
        del data
        converted = script_from_notebook(text, argv[3])
        del text
        script = converted.script.encode()
        header = {"converted": {**asdict(converted), "script": None}}
    except (NotebookError, UnicodeDecodeError) as exc:
        header = {"error": str(exc)}
    except MemoryError:
        os._exit(EXIT_MEMORY)
    try:
        sys.stdout.buffer.write(json.dumps(header).encode() + b"\n" + script)
        sys.stdout.buffer.flush()
    except OSError:
        os._exit(EXIT_OUTPUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1:]))
