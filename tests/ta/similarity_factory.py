"""Exports for the similarity check: planted copies among independent submissions.

The source of the copies is the reference solution's code. One copy is verbatim; the
other is rewritten the way a student hides a copy: every local name, argument and
top-level function renamed, the top-level definitions in reverse order, comments gone
(``ast.unparse``). Independent submissions carry code nobody copied: standard-library
modules of assignment size, a different one in each file of each submission.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import shutil
from pathlib import Path

from tests.conftest import ASSIGNMENT, SOLUTION

#: The files a planted copy holds (the solution's Part 1 and Part 2 code).
COPIED = ("question1.py", "transformer_skeleton.py")
#: Standard-library modules of a few hundred lines: independent code, two per submission.
INDEPENDENT = (
    "textwrap", "fractions", "colorsys", "bisect", "heapq", "shlex", "glob", "fnmatch",
    "calendar", "statistics", "difflib", "graphlib", "sched", "queue", "string", "base64",
    "netrc", "gettext", "mimetypes", "quopri", "uu", "wave", "chunk", "sndhdr", "imghdr",
    "tabnanny", "pyclbr", "filecmp", "cmd", "code", "codeop", "dis", "pprint", "reprlib",
    "numbers", "operator", "copy", "keyword", "linecache", "tokenize", "stringprep",
    "plistlib", "zipapp", "webbrowser", "getopt", "optparse", "ftplib", "poplib",
    "smtplib", "telnetlib", "nntplib", "imaplib", "mailbox", "mailcap", "csv", "secrets",
    "hmac", "hashlib", "uuid", "ipaddress", "locale", "ntpath", "posixpath", "genericpath",
    "stat", "tempfile", "shutil", "fileinput", "pathlib", "zipimport", "runpy", "pkgutil",
    "modulefinder", "trace", "timeit", "cProfile", "pstats", "profile", "pdb", "bdb",
    "symtable", "ast", "inspect", "contextlib", "functools", "abc", "weakref", "enum",
    "dataclasses", "typing", "types", "warnings", "traceback", "argparse", "selectors",
    "socketserver", "sysconfig", "platform", "subprocess", "threading", "signal",
    "datetime", "decimal", "random", "ssl", "socket", "asyncio.base_events", "json.decoder",
)  # fmt: skip


def stdlib_source(name: str) -> str:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return inspect.getsource(importlib.import_module(name))


class _Renamer(ast.NodeTransformer):
    """Every argument, local and top-level function renamed (v0, v1, ...; f0, f1, ...)."""

    def __init__(self, functions: set[str]) -> None:
        self.names = {f: f"f{i}" for i, f in enumerate(sorted(functions))}

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self.names.get(node.name, node.name)
        local = [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg != "self"]
        local += [
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        ]
        renames = {n: f"v{i}" for i, n in enumerate(dict.fromkeys(local))}
        for sub in ast.walk(node):
            if isinstance(sub, ast.arg) and sub.arg in renames:
                sub.arg = renames[sub.arg]
            if isinstance(sub, ast.Name) and sub.id in renames:
                sub.id = renames[sub.id]
            if isinstance(sub, ast.keyword) and sub.arg in renames:
                sub.arg = renames[sub.arg]
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.names.get(node.id, node.id)
        return node


def disguised(source: str) -> str:
    """``source`` renamed and reordered as a student hiding a copy would."""
    tree = ast.parse(source)
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    tree = _Renamer(functions).visit(tree)
    head = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    tree.body = head + defs[::-1]
    return ast.unparse(tree)


def build_similarity_export(dest: Path, independent: int) -> dict[str, str]:
    """An export of the original, a verbatim copy, a disguised copy, the untouched
        skeleton and ``independent`` submissions of unrelated code; ``submission_N`` is by
    "Student N". Returns folder -> role."""
    roles = {"submission_1": "original", "submission_2": "verbatim", "submission_3": "disguised",
             "submission_4": "skeleton"}  # fmt: skip
    for i in range(independent):
        roles[f"submission_{i + 5}"] = "independent"
    pool = itertools.cycle(INDEPENDENT)  # past its length (a timing run) modules repeat
    for folder, role in roles.items():
        target = dest / folder
        shutil.copytree(ASSIGNMENT, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in COPIED:
            if role in ("original", "verbatim"):
                (target / name).write_text((SOLUTION / name).read_text())
            elif role == "disguised":
                (target / name).write_text(disguised((SOLUTION / name).read_text()))
            elif role == "independent":
                (target / name).write_text(stdlib_source(next(pool)))
    (dest / "submission_metadata.yml").write_text(
        "".join(f"{f}:\n  :submitters:\n  - :name: Student {f.rsplit('_', 1)[1]}\n" for f in roles)
    )
    return roles


#: A file name and a folder name that are HTML: raw in a page, they run the student's script.
HOSTILE_FILE = "<img src=x onerror=alert(document.domain)>.py"
HOSTILE_FOLDER = "<svg onload=alert(1)>"
#: A line of code that is HTML (it closes copydetect's code block and opens a script).
HOSTILE_LINE = 'NOTE = "</code></pre><script>alert(1)</script>"\n'
#: Text that only files outside the export hold: no report may show it.
OUTSIDE = "OUTSIDE_THE_EXPORT"


def build_hostile_export(dest: Path, outside: Path) -> None:
    """An export whose names and code are HTML, with links out of it.

    ``submission_1`` and the folder :data:`HOSTILE_FOLDER` share a copied file named
    :data:`HOSTILE_FILE` that holds :data:`HOSTILE_LINE`. ``submission_2`` has code of its
    own, a ``question1.py`` that links to a copy of the others' outside the export and a
    ``llama/`` that links to a folder outside it; ``submission_9`` is a link to a folder
    outside the export holding the same copies. Everything outside holds :data:`OUTSIDE`."""
    copied = HOSTILE_LINE + (SOLUTION / "question1.py").read_text()
    leaked = f"# {OUTSIDE}\n{copied}"
    for folder in ("submission_1", HOSTILE_FOLDER):
        (dest / folder / "llama").mkdir(parents=True)
        for name in (HOSTILE_FILE, "question1.py", "llama/model.py"):
            (dest / folder / name).write_text(copied)
    (outside / "submission_9" / "llama").mkdir(parents=True)
    for name in (HOSTILE_FILE, "question1.py", "llama/model.py"):
        (outside / "submission_9" / name).write_text(leaked)
    (dest / "submission_2").mkdir()
    (dest / "submission_2" / HOSTILE_FILE).write_text(stdlib_source("textwrap"))
    (dest / "submission_2" / "question1.py").symlink_to(outside / "submission_9" / "question1.py")
    (dest / "submission_2" / "llama").symlink_to(outside / "submission_9" / "llama")
    (dest / "submission_9").symlink_to(outside / "submission_9")
    (dest / "submission_metadata.yml").write_text(
        "".join(f"'{f}':\n  :submitters: []\n" for f in ("submission_1", "submission_2"))
    )
