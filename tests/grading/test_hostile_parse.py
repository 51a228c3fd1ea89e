"""Untrusted files parsed where untrusted code runs: whole gradings of the notebook bombs, the
statement after a ``;`` and a printed ``1e400``.

Each grading runs in a process of its own that reports the grader's peak memory (its own,
not its workers'), inside a 768 MB memory cgroup as on Gradescope where the machine
allows one (root and a memory controller). Each ends in a valid results file with a
verdict on every check; a notebook that cannot be turned into a script costs Part 4 its
points, with a message, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from grader.core.points import POINTS
from grader.core.results import validate_results
from tests.conftest import (
    ATTACK,
    EXPERIMENT_CELLS,
    ROOT,
    SOLUTION,
    notebook_from_script,
    notebook_text,
    patched_solution,
)
from tests.grading.test_hostile_memory import CONTROLLER, LIMIT, V1, memory_cgroup
from tests.parts.part1.test_course_script import ANSWERED, grade_script
from tests.sandbox.test_notebook_child import PEAK

pytestmark = ATTACK

#: The grading, its own peak memory printed at its end.
GRADE = PEAK + (
    "import sys\n"
    "from pathlib import Path\n"
    "from grader.grading.runner import grade\n"
    "submission, results, parts, numbers = sys.argv[1:5]\n"
    "grade(Path(submission), results_path=Path(results), parts=parts.split(','),\n"
    "      device='cpu', numbers=frozenset(numbers.split(',')))\n"
    "print(peak())\n"
)
#: The grader's own peak: a grading's is about 50 MiB (the 1 MiB cell parsed in the
#: grader took it to 950 MiB), and the notebook's child (at most 320 MiB) and the worker
#: share Gradescope's 768 MB with it.
GRADER_PEAK = 200 * 2**20
#: Part 4's checks that do not time the lab (the upload decides what imports, not speed).
UNTIMED = sorted(set(POINTS["part4"]) - {"4.6"})


@contextlib.contextmanager
def in_768_mb() -> Iterator[Path | None]:
    """The cgroup's ``cgroup.procs`` (or v1 ``tasks``) where the machine allows one."""
    if CONTROLLER is None:
        yield None
        return
    with memory_cgroup(LIMIT) as group:
        yield group / ("tasks" if CONTROLLER == V1 else "cgroup.procs")


def grade_measured(submission: Path, out: Path, numbers: list[str]) -> tuple[dict, int]:
    """Grade the checks ``numbers`` (of their parts) in a process of its own, in 768 MB
    where possible; the results file, validated, and the grader's own peak in bytes."""
    results = out / "results.json"
    parts = sorted({f"part{n.split('.')[0]}" for n in numbers})
    with in_768_mb() as procs:
        proc = subprocess.run(
            [sys.executable, "-c", GRADE, str(submission), str(results), ",".join(parts),
             ",".join(numbers)],
            cwd=ROOT,
            preexec_fn=None if procs is None else lambda: procs.write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(results.read_text())
    validate_results(data)
    assert {t["number"] for t in data["tests"]} == set(numbers)
    assert all(isinstance(t.get("score"), (int, float)) for t in data["tests"])
    return data, int(proc.stdout.split()[-1])


def lab_notebook(dest: Path, *extra: str) -> Path:
    """The whole reference, its lab handed in as a notebook with ``extra`` cells after the
    experiment cells."""
    patched_solution(dest, "question1.py", [])
    (dest / "kv_lab.py").unlink()
    source = dest / "lab_source"
    notebook_from_script(SOLUTION / "kv_lab.py", source, (*EXPERIMENT_CELLS, *extra))
    (source / "kv_lab.ipynb").rename(dest / "kv_lab.ipynb")
    source.rmdir()
    return dest


def by_number(data: dict) -> dict[str, dict]:
    return {t["number"]: t for t in data["tests"]}


def test_a_notebook_cell_of_1_mib_costs_part4_its_points_and_nothing_else(
    tmp_path: Path,
) -> None:
    """1 MiB of ``1,`` in one cell, under the cap on code: a syntax tree of 500 MB, which
    took the grader to 950 MiB and Gradescope's placeholder page. Read in the child, it
    runs the child out of memory: Part 4 is not graded, and says so; Part 1 is."""
    submission = lab_notebook(tmp_path / "upload")
    (submission / "kv_lab.ipynb").write_text(notebook_text("x = [" + "1," * (2**19 - 4) + "]"))
    part1 = sorted(POINTS["part1"])
    data, peak = grade_measured(submission, tmp_path, [*part1, *UNTIMED])
    assert peak < GRADER_PEAK
    tests = by_number(data)
    said = "kv_lab.ipynb could not be turned into a script: reading it needs more than"
    assert said in tests["4.1"]["output"] and said in data["output"]  # once, on the page
    for number in UNTIMED:
        assert tests[number]["score"] == 0
        assert said in tests[number]["output"] or "4.1 says which" in tests[number]["output"]
    assert sum(tests[n]["score"] for n in part1) == sum(POINTS["part1"].values())


def test_100_kb_of_imports_on_one_line_is_graded_as_the_lab(tmp_path: Path) -> None:
    """``import os;`` 10,000 times on one line, beside the reference's lab: written as the
    whole line for each import, a script of 1 GB (the grader was killed in 1.9 s); as each
    statement's own span, 100 KB, and the lab scores what the reference scores."""
    submission = lab_notebook(tmp_path / "upload", "import os;" * 10_000)
    data, peak = grade_measured(submission, tmp_path, UNTIMED)
    assert peak < GRADER_PEAK
    tests = by_number(data)
    assert all(tests[n]["score"] == POINTS["part4"][n] for n in UNTIMED), data["output"]


def test_a_statement_after_a_semicolon_does_not_run_and_is_named(tmp_path: Path) -> None:
    """``import os; raise SystemExit(...)``: the import is kept, the statement riding on its
    line is not run (run, it would stop the lab's import and every check with it), and the
    page names it."""
    riding = "import os; raise SystemExit('the statement after the ; ran')"
    submission = lab_notebook(tmp_path / "upload", riding)
    data, _ = grade_measured(submission, tmp_path, UNTIMED)
    tests = by_number(data)
    assert all(tests[n]["score"] == POINTS["part4"][n] for n in UNTIMED), data["output"]
    cell = len(notebook_cells(submission / "kv_lab.ipynb"))
    assert (
        "among them 1 on a line with a kept statement (only whole statements are kept): "
        f"\"raise SystemExit('the statement after the ; ran')\" (code cell {cell}, line 1)"
    ) in data["output"]


def notebook_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_a_printed_1e400_is_unreadable_for_its_check_and_every_other_is_graded(
    tmp_path: Path,
) -> None:
    """A course-style Part 1 script that prints ``1e400`` for its batch size: the parser
    overflowed and all of Part 1's checks showed the exception. Now the batch size's
    check names the line, and every other answer the script prints is graded."""
    graded = grade_script(
        tmp_path,
        [('print(f"Max batch size possible: {batch}")', 'print("Max batch size possible: 1e400")')],
    )
    output = graded.output("1.4")
    assert "the line 'Max batch size possible: 1e400' cannot be read unambiguously" in output
    assert "'1e400' is not a number we can read" in output
    assert graded.score("1.4") == 0
    assert "'1e400' is not a number we can read" in graded.output("1.10")  # the table's
    assert graded.score("1.10") == 0
    for number in set(ANSWERED) - {"1.4", "1.10"}:
        assert graded.test(number)["status"] == "passed", graded.output(number)
    for test in graded.data["tests"]:
        assert "OverflowError" not in test.get("output", "")
