"""A lab notebook turned into a script in a child process, never in the grader.

A notebook is the student's file: reading it builds the student's JSON and syntax trees,
whose size the student chooses (1 MiB of ``1,`` in one cell is a tree of 500 MB). Done in
the grader, that memory is the grader's: on Gradescope's 768 MB the grader was killed and
the student saw no verdict at all. So the grader only opens the file (without following a
link, and only a regular file) and hands it, as stdin, to a bare interpreter that runs
:mod:`grader.sandbox.notebook` with limits it sets on itself before it reads anything:
its memory, its CPU time and the size of what it writes (a file of the grader's, its
stdout). As root the child runs as the grading's worker account. The grader reads its
answer, bounded; a child that runs out of memory or time, or dies, is a notebook that
"could not be turned into a script": Part 4 is not graded, with a message saying why and
what to hand in instead, and every other part is graded as usual.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from grader.sandbox import notebook
from grader.sandbox.identity import WorkerIdentity
from grader.sandbox.notebook import (
    EXIT_MEMORY,
    EXIT_OUTPUT,
    MAX_NOTEBOOK_BYTES,
    MAX_SCRIPT_BYTES,
    TOO_LARGE,
    Converted,
    NotebookError,
)

MIB = 2**20
#: The child's address space: an interpreter (15 MB) and a lab notebook of 20 MiB with its
#: plots read as text and as JSON, with room; far under what the grader and its worker
#: have on Gradescope's 768 MB beside it. A lab's code cells parse in a few MiB.
CHILD_MEMORY_BYTES = 320 * MIB
CHILD_CPU_SECONDS = 30  # RLIMIT_CPU: reading a lab takes well under a second
CHILD_WALL_SECONDS = 60.0  # a child that waits on nothing yet has not ended
#: The child's stdout: one line of JSON, then the script.
CHILD_OUTPUT_BYTES = MAX_SCRIPT_BYTES + MIB
NO_SCRIPT = "the grader's reading of it gave no script"


class NotConverted(NotebookError):
    """The child that reads the notebook ran out of memory or time, or died: the notebook
    "could not be turned into a script", and the message says why and what to do."""


def open_notebook(path: Path) -> int:
    """A read-only descriptor of the notebook ``path``, which must be a regular file no
    larger than :data:`MAX_NOTEBOOK_BYTES`: never a link followed, never a FIFO that would
    block the open, and the size decided before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise NotebookError(f"it cannot be opened ({exc.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_NOTEBOOK_BYTES:
        os.close(fd)
        raise NotebookError(TOO_LARGE if stat.S_ISREG(info.st_mode) else "it is not a file")
    return fd


def child_command(name: str) -> list[str]:
    """A bare interpreter (no site, no environment, no current folder on its path) running
    :mod:`grader.sandbox.notebook`'s source: the worker account needs to read nothing of
    the grader's."""
    source = Path(notebook.__file__).read_text(encoding="utf-8")
    limits = (CHILD_MEMORY_BYTES, CHILD_CPU_SECONDS, CHILD_OUTPUT_BYTES)
    return [sys.executable, "-I", "-S", "-c", source, *map(str, limits), name]


def _as_account(identity: WorkerIdentity | None) -> dict[str, Any]:
    """Popen's arguments that run the child as the worker account (when the grader is
    root and has one), with no supplementary groups."""
    if identity is None or not identity.dropped:
        return {}
    return {"user": identity.uid, "group": identity.gid, "extra_groups": []}


def _run_child(fd: int, name: str, identity: WorkerIdentity | None, out: IO[bytes]) -> int:
    """The child's exit status (negative: the signal that ended it); its output in ``out``."""
    proc = subprocess.Popen(
        child_command(name),
        stdin=fd,
        stdout=out,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        close_fds=True,
        **_as_account(identity),
    )
    try:
        return proc.wait(timeout=CHILD_WALL_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -signal.SIGKILL


def why_not_converted(status: int) -> str:
    """What a child's exit status says about the notebook, for the student."""
    if status == EXIT_MEMORY:
        return (
            f"reading it needs more than the {CHILD_MEMORY_BYTES // MIB} MiB of memory the "
            "grader gives a notebook (a lab's, plots included, needs tens): keep data in "
            "files, not in code cells"
        )
    if status in (-signal.SIGXCPU, -signal.SIGKILL):
        return (
            f"reading it took longer than the {CHILD_CPU_SECONDS} s the grader gives a "
            "notebook (a lab's takes under a second)"
        )
    if status in (EXIT_OUTPUT, -signal.SIGXFSZ):
        return f"the script it defines is larger than {MAX_SCRIPT_BYTES // MIB} MiB"
    how = f"signal {-status}" if status < 0 else f"status {status}"
    return f"the grader's reading of it stopped ({how})"


def _converted(header: Any, script: bytes) -> Converted:
    """The child's answer checked field by field (it read the student's file)."""
    fields = header.get("converted") if isinstance(header, dict) else None
    if isinstance(header, dict) and isinstance(header.get("error"), str):
        raise NotebookError(header["error"][:1000])
    counts = [fields.get(k) for k in ("kept", "not_run", "magics")] if fields else [None]
    broken = fields.get("broken_cells") if fields else None
    shared = fields.get("shared_line") if fields else None
    if not (
        all(type(n) is int for n in counts)
        and isinstance(broken, list)
        and all(type(n) is int for n in broken)
        and isinstance(shared, list)
        and all(isinstance(s, str) for s in shared)
    ):
        raise NotConverted(NO_SCRIPT)
    kept, not_run, magics = counts
    return Converted(script.decode(), kept, not_run, magics, broken, shared)


def convert_notebook(path: Path, identity: WorkerIdentity | None = None) -> Converted:
    """The script the notebook at ``path`` defines (:func:`notebook.script_from_notebook`),
    worked out by a limited child, as ``identity``'s worker account where the grader is
    root. Raises :class:`NotebookError` for a file that is no notebook, and
    :class:`NotConverted` when the child fails."""
    fd = open_notebook(path)
    try:
        with tempfile.TemporaryFile() as out:
            status = _run_child(fd, path.name, identity, out)
            if status != 0:
                raise NotConverted(why_not_converted(status))
            out.seek(0)
            line = out.readline(64 * 1024)
            script = out.read(CHILD_OUTPUT_BYTES)
    finally:
        os.close(fd)
    try:
        header = json.loads(line)
        script.decode()
    except (ValueError, UnicodeDecodeError):
        raise NotConverted(NO_SCRIPT) from None
    return _converted(header, script)
