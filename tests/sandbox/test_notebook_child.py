"""A notebook is read in a limited child, never in the grader: the grader's memory stays
small whatever the notebook holds, the child runs as the worker account under root, and
a child that fails in any way is a notebook that "could not be turned into a script"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader.core.paths import ASSIGNMENT
from grader.core.registry import PARTS
from grader.sandbox import notebook_child
from grader.sandbox.identity import resolve_identity
from grader.sandbox.layout import lay_out_part
from grader.sandbox.notebook import EXIT_MEMORY, EXIT_OUTPUT, NotebookError
from grader.sandbox.notebook_child import NotConverted, convert_notebook, open_notebook
from tests.conftest import ROOT, notebook_text

#: A process's own peak resident memory: its memory map's high-water mark (``VmHWM``), as
#: ``getrusage``'s ``ru_maxrss`` keeps that of the process it was forked from (pytest).
PEAK = (
    "def peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1]) * 1024\n"
)
#: The grader's own peak while it lays out a notebook's part, in a process of its own.
LAY_OUT = PEAK + (
    "import sys\n"
    "from pathlib import Path\n"
    "from grader.core.paths import ASSIGNMENT\n"
    "from grader.core.registry import PARTS\n"
    "from grader.sandbox.layout import lay_out_part\n"
    "layout = lay_out_part(Path(sys.argv[1]), PARTS['part4'], ASSIGNMENT)\n"
    "print(peak())\n"
    "print(layout.missing_message(PARTS['part4']) or layout.converted[0])\n"
)
#: Far under what the cell below took the grader to (500 MB of syntax tree), and under
#: Gradescope's 768 MB with the child's own limit beside it.
GRADER_PEAK = 160 * 2**20


@pytest.mark.parametrize(
    ("cell", "said"),
    [
        ("x = [" + "1," * (2**19 - 4) + "]", "could not be turned into a script: reading it "),
        ("import os;" * 10_000 + "\ndef f():\n    return os.sep", "kept 10001 imports"),
    ],
    ids=["1-MiB-cell", "100-KB-of-imports"],
)
def test_the_graders_memory_stays_small_whatever_the_notebook_holds(
    tmp_path: Path, cell: str, said: str
) -> None:
    """One cell of 1 MiB of ``1,`` (under the cap on code) is a syntax tree of 500 MB, and
    took the grader to 950 MiB when it parsed notebooks itself; now the child runs out of
    its memory and the page says so. 100 KB of ``import os;`` is a script of 100 KB."""
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text(cell))
    done = subprocess.run(
        [sys.executable, "-c", LAY_OUT, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    peak, message = done.stdout.split("\n", 1)
    assert int(peak) < GRADER_PEAK
    assert said in message


def test_a_notebook_past_the_childs_memory_is_named_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text("a = 1\n" * (2**20 // 6 - 1)))
    layout = lay_out_part(tmp_path, PARTS["part4"], ASSIGNMENT)
    assert layout.base is None and layout.missing == ["kv_lab.py"]
    assert layout.missing_message(PARTS["part4"]) == (
        "kv_lab.ipynb could not be turned into a script: reading it needs more than the 320 "
        "MiB of memory the grader gives a notebook (a lab's, plots included, needs tens): "
        "keep data in files, not in code cells, so part4 was not graded. Upload kv_lab.py, "
        "or the notebook saved again from Jupyter, and resubmit."
    )
    assert not (tmp_path / "kv_lab.py").exists()


def fake_child(monkeypatch: pytest.MonkeyPatch, program: str) -> None:
    """The child replaced by ``program``, run as the real one is (on the notebook as stdin)."""
    monkeypatch.setattr(
        notebook_child, "child_command", lambda name: [sys.executable, "-I", "-c", program]
    )


HEADER = {"kept": 1, "not_run": 0, "magics": 0, "broken_cells": [], "shared_line": []}


@pytest.mark.parametrize(
    ("program", "said"),
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGXCPU)", "took longer than the 30 s"),
        (
            "import os, signal; signal.signal(signal.SIGXFSZ, signal.SIG_DFL); "
            "os.kill(os.getpid(), signal.SIGXFSZ)",
            "larger than 8 MiB",
        ),
        (f"raise SystemExit({EXIT_OUTPUT})", "larger than 8 MiB"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "stopped (signal 11)"),
        (f"raise SystemExit({EXIT_MEMORY})", "needs more than the 320 MiB"),
        ("raise SystemExit(3)", "stopped (status 3)"),
        ("print('not json')", "gave no script"),
        (f"print({json.dumps(json.dumps({'converted': {**HEADER, 'kept': '1'}}))})", "no script"),
        ("import sys; sys.stdout.buffer.write(b'{}\\n\\xff')", "gave no script"),
    ],
    ids=[
        "cpu",
        "output-signal",
        "output",
        "crash",
        "memory",
        "status",
        "garbage",
        "wrong-type",
        "not-utf-8",
    ],
)
def test_a_child_that_fails_is_a_notebook_not_turned_into_a_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str, said: str
) -> None:
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text("import os"))
    fake_child(monkeypatch, program)
    with pytest.raises(NotConverted, match=said.replace("(", r"\(").replace(")", r"\)")):
        convert_notebook(tmp_path / "kv_lab.ipynb")


def test_the_childs_output_is_bounded_by_its_own_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real child, its output file limited to 200 bytes: the script does not fit, and
    the child says so by its status rather than hand the grader part of one."""
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text("import os\n" * 100))
    monkeypatch.setattr(notebook_child, "CHILD_OUTPUT_BYTES", 200)
    with pytest.raises(NotConverted, match="the script it defines is larger than 8 MiB"):
        convert_notebook(tmp_path / "kv_lab.ipynb")


def test_a_child_that_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text("import os"))
    fake_child(monkeypatch, "import time; print(time.sleep(3600))")
    monkeypatch.setattr(notebook_child, "CHILD_WALL_SECONDS", 0.2)
    with pytest.raises(NotConverted, match="took longer than"):
        convert_notebook(tmp_path / "kv_lab.ipynb")


def test_the_childs_answer_is_the_script_and_its_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text("import os"))
    head = json.dumps({"converted": {**HEADER, "shared_line": ["'x' (code cell 1, line 1)"]}})
    fake_child(monkeypatch, f"import sys; sys.stdout.write({head!r} + '\\nimport os\\n')")
    converted = convert_notebook(tmp_path / "kv_lab.ipynb")
    assert converted.script == "import os\n" and converted.kept == 1
    assert converted.shared_line == ["'x' (code cell 1, line 1)"]


def test_only_a_regular_file_is_opened(tmp_path: Path) -> None:
    """A FIFO would block the grader's open; a link could point anywhere root can read."""
    os.mkfifo(tmp_path / "fifo.ipynb")
    with pytest.raises(NotebookError, match="it is not a file"):
        open_notebook(tmp_path / "fifo.ipynb")
    (tmp_path / "real.ipynb").write_text(notebook_text("import os"))
    (tmp_path / "link.ipynb").symlink_to(tmp_path / "real.ipynb")
    with pytest.raises(NotebookError, match="it cannot be opened"):
        open_notebook(tmp_path / "link.ipynb")


@pytest.mark.needs_root(reason="the child runs as the worker account only under root")
def test_under_root_the_child_is_the_worker_account_and_reads_only_what_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notebook is root's, owner-only, in a folder the worker cannot enter: the child,
    as the worker account with no supplementary groups, reads it from the descriptor it
    was handed, and converts it."""
    identity = resolve_identity()
    if not identity.dropped:
        pytest.skip("no unprivileged account can run this interpreter")
    folder = tmp_path / "closed"
    folder.mkdir(mode=0o700)
    path = folder / "kv_lab.ipynb"
    path.write_text(notebook_text("import os\ndef f():\n    return os.sep"))
    path.chmod(0o600)
    assert convert_notebook(path, identity).kept == 2
    ids = "import json, os; print(json.dumps({'error': repr((os.getuid(), os.getgroups()))}))"
    fake_child(monkeypatch, ids)
    with pytest.raises(NotebookError) as raised:
        convert_notebook(path, identity)
    assert str(raised.value) == repr((identity.uid, []))
    assert raised.type is NotebookError  # the child's own answer, not a failed child


#: A grader started under hard limits below the child's own (a TA's ``ulimit``).
UNDER_ULIMIT = (
    "import resource, sys\n"
    "from pathlib import Path\n"
    "resource.setrlimit(resource.RLIMIT_AS, (300 * 2**20, 300 * 2**20))\n"
    "resource.setrlimit(resource.RLIMIT_CPU, (20, 20))\n"
    "from grader.sandbox.notebook_child import convert_notebook\n"
    "print(convert_notebook(Path(sys.argv[1])).summary())\n"
)


def test_a_child_started_under_lower_hard_limits_keeps_them_and_converts(tmp_path: Path) -> None:
    """The child lowers its limits to its own or to the hard limits it inherited, whichever
    is lower: asking for more than the hard limit would fail, and the notebook with it."""
    (tmp_path / "kv_lab.ipynb").write_text(notebook_text("import os\ndef f():\n    return 1"))
    done = subprocess.run(
        [sys.executable, "-c", UNDER_ULIMIT, str(tmp_path / "kv_lab.ipynb")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "kept 2 imports, definitions and the values they read\n"
