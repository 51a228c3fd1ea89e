"""Shared fixtures: graded results of the solution and the blank skeleton (built once per
test run, however many pytest-xdist workers share it), and a factory that writes a patched
copy of the solution and grades it."""

from __future__ import annotations

import ast
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from grader.core.registry import PARTS
from grader.core.results import GradingResults, validate_results
from grader.grading.runner import grade
from grader.sandbox import forkserver
from grader.sandbox.sandbox import Limits

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "solution"
ASSIGNMENT = ROOT / "assignment"

#: Short timeouts keep the misbehaving-submission tests fast, with room for a machine
#: running the suite on every core (pytest-xdist) while a check imports torch.
FAST_LIMITS = Limits(request_timeout_s=5.0, startup_timeout_s=15.0)
#: Part 2 requests run longer than Part 1's (up to 1024 cached calls in one request).
PART2_LIMITS = Limits(request_timeout_s=20.0, startup_timeout_s=30.0)


@dataclass
class Graded:
    """A grading run: the results object, their plain text (``data``, what the checks
    wrote) and the file Gradescope reads (``file``: the same in Markdown)."""

    results: GradingResults
    data: dict
    file: dict

    def test(self, number: str) -> dict:
        return next(t for t in self.data["tests"] if t.get("number") == number)

    def score(self, number: str) -> float:
        return self.test(number)["score"]

    def output(self, number: str) -> str:
        return self.test(number).get("output", "")

    def shown(self, number: str) -> str:
        """The check's feedback as the student reads it (Markdown, from the file)."""
        test = next(t for t in self.file["tests"] if t.get("number") == number)
        return test.get("output", "")

    def part_tests(self, part: str) -> list[dict]:
        return [t for t in self.data["tests"] if part in t.get("tags", [])]

    def part_score(self, part: str) -> float:
        return sum(t["score"] for t in self.part_tests(part))


def run_grade(submission: Path, out: Path, **kwargs) -> Graded:
    path = out / "results.json"
    results = grade(submission, results_path=path, **kwargs)
    data = json.loads(path.read_text())
    validate_results(data)
    assert results is not None, data.get("output")
    plain = results.to_gradescope()
    (out / "plain.json").write_text(json.dumps(plain))  # for load_graded
    return Graded(results, plain, data)


def built_once(
    tmp_path_factory: pytest.TempPathFactory,
    worker_id: str,
    name: str,
    build: Callable[[Path], None],
) -> Path:
    """A folder that ``build`` fills once for the whole test run: under pytest-xdist the
    first worker to ask builds it and the others wait for it, so an expensive grading
    is not repeated on every worker."""
    if worker_id == "master":  # not distributed
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    folder = tmp_path_factory.getbasetemp().parent / name
    with FileLock(f"{folder}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a half-built folder of a crashed worker
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


def load_graded(folder: Path) -> Graded:
    """A grading's results file, read back (and checked against the schema), with the
    plain text :func:`run_grade` kept beside it."""
    data = json.loads((folder / "results.json").read_text())
    validate_results(data)
    plain = json.loads((folder / "plain.json").read_text())
    return Graded(GradingResults.from_gradescope(plain), plain, data)


@pytest.fixture(scope="module")
def worker_modules_importable() -> Iterator[None]:
    """The worker's modules (``values``, ``tensor_search``) importable by their flat names,
    as an adapter imports them in the sandbox, for tests that call an adapter here."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT / "grader" / "worker"))
        yield


@pytest.fixture
def own_fork_servers() -> Iterator[None]:
    """The fork servers of a test that starts, drops or counts them, kept apart from the
    one this test worker's gradings share: the test begins with none, as a fresh grader
    does, and ends by closing its own, and the next grading here forks from the shared
    one again instead of importing torch and transformers anew."""
    kept = dict(forkserver._SERVERS), dict(forkserver._REFUSED)
    forkserver._SERVERS.clear()
    forkserver._REFUSED.clear()
    try:
        yield
    finally:
        forkserver.close_all()
        forkserver._REFUSED.clear()
        forkserver._SERVERS.update(kept[0])
        forkserver._REFUSED.update(kept[1])


@pytest.fixture(scope="session")
def solution_graded(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Graded:
    def build(out: Path) -> None:
        run_grade(SOLUTION, out)

    return load_graded(built_once(tmp_path_factory, worker_id, "solution-graded", build))


@pytest.fixture(scope="session")
def blank_graded(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Graded:
    """The blank skeleton as solution/ generates it now (tests/test_skeleton.py checks that
    the committed assignment/ is the same files)."""
    from grader.ta import skeleton

    def build(out: Path) -> None:
        blank = out / "skeleton"
        skeleton.write(blank)
        run_grade(blank, out)

    return load_graded(built_once(tmp_path_factory, worker_id, "blank-graded", build))


def _private_view_available() -> bool:
    from grader.sandbox.mounts import mount_isolation

    return os.geteuid() == 0 and not mount_isolation()


#: Tests of the worker's private view of the files (grader/sandbox/mounts.py).
PRIVATE_VIEW = pytest.mark.needs_root(
    reason="needs root and a private mount namespace", available=_private_view_available
)

#: A hostile design whose grading is long by construction (a cache-free path slowed or
#: padded on purpose, so that its own ratios look like a cache's): graded by
#: ``make attack-tests`` (CI runs it), not by ``make test``, which keeps a cheaper design
#: that the same defence catches.
ATTACK = pytest.mark.attacks

#: What a test module uses to run whole gradings: its tests carry the ``grading`` mark.
GRADING_ENTRY_POINTS = ("run_grade", "grade", "run_mutants", "run_local", "grade_course_style")
GRADED_FIXTURES = {"solution_graded", "blank_graded", "course_graded", "regraded"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``needs_root`` tests are skipped without root (or without what their mark's
    ``available`` says they need); tests that run gradings are marked ``grading``. Grouped
    tests (``xdist_group``: long units one worker runs whole) come first, so that under
    pytest-xdist the short tests fill the workers' last minutes instead of a long unit."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
    for item in items:
        mark = item.get_closest_marker("needs_root")
        if mark is not None:
            available = mark.kwargs.get("available", lambda: os.geteuid() == 0)
            if not available():
                item.add_marker(pytest.mark.skip(reason=mark.kwargs.get("reason", "needs root")))
        module = getattr(item, "module", None)
        if GRADED_FIXTURES & set(getattr(item, "fixturenames", ())) or any(
            hasattr(module, name) for name in GRADING_ENTRY_POINTS
        ):
            item.add_marker(pytest.mark.grading)


def refused(output: str) -> bool:
    """Unreadable (permissions) or unseen (the worker's private view of the files)."""
    return "PermissionError" in output or "FileNotFoundError" in output


PARAM_COUNT_BODY = "    d, kv_dim = spec.d_model"


def in_param_count(code: str) -> tuple[str, str]:
    """An edit that runs ``code`` (indented lines) at the start of ``param_count``."""
    return PARAM_COUNT_BODY, f"{code}\n{PARAM_COUNT_BODY}"


def library_edits(part: str, **options: Any) -> set[tuple[str, str]]:
    """Every (old, new) edit of ``part``'s mutant-library mistakes (``load_mutants``'s
    ``options``): a mistake a test writes as one nobody listed must be none of them."""
    from grader.ta.mutants import load_mutants

    return {(old, new) for m in load_mutants(part, **options) for old, new in m.edits}


def one_kept_quick(names: list[str], marks: Callable[[str], list] | None = None) -> list:
    """``names`` as parameters of a graded test: the first graded by ``make test``, the
    others marked ``isolation`` (graded by ``make mutant-tests`` and CI), so that the quick
    suite keeps one graded mistake of each kind. ``marks`` adds a name's own marks."""
    later = [pytest.mark.isolation]
    return [
        pytest.param(n, marks=[*(marks(n) if marks else []), *(later if i else [])])
        for i, n in enumerate(names)
    ]


def patched_solution(dest: Path, file: str, edits: list[tuple[str, str]]) -> Path:
    """Copy solution/ to ``dest`` and apply ``(old, new)`` edits (each must match once)."""
    shutil.copytree(SOLUTION, dest, ignore=shutil.ignore_patterns("__pycache__", "*.png"))
    target = dest / file
    text = target.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"edit anchor {old!r} must occur exactly once"
        text = text.replace(old, new)
    target.write_text(text)
    return dest


#: A lab notebook's cells that run the experiments, as a student's notebook ends: none
#: may run when the notebook is graded (the last one would stop the import).
EXPERIMENT_CELLS = (
    "%matplotlib inline\nmodel = load_model()\nprint(model_config_summary(model))",
    "latency = measure_latency(model, (32, 64, 128, 256))\nprint(latency)",
    "raise SystemExit('the experiment cells ran when the notebook was graded')",
)


def notebook_text(*cells: str, markdown: str | None = None) -> str:
    """A Jupyter notebook (format 4) of these code cells, after one Markdown cell if
    ``markdown``, each cell's source stored as Jupyter stores it: a list of lines."""
    body = [{"cell_type": "markdown", "metadata": {}, "source": [markdown]}] if markdown else []
    body += [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": cell.splitlines(keepends=True)}
        for cell in cells
    ]  # fmt: skip
    return json.dumps({"cells": body, "nbformat": 4, "nbformat_minor": 5, "metadata": {}})


def notebook_from_script(script: Path, dest: Path, extra_cells: tuple[str, ...] = ()) -> Path:
    """``dest`` holding ``<script>.ipynb``: a notebook with a code cell per top-level
    statement of ``script`` (decorators with their definition), then ``extra_cells``."""
    source = script.read_text()
    lines = source.splitlines(keepends=True)
    cells = []
    for node in ast.parse(source).body:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        cells.append("".join(lines[first - 1 : node.end_lineno]))
    dest.mkdir(parents=True)
    (dest / script.with_suffix(".ipynb").name).write_text(notebook_text(*cells, *extra_cells))
    return dest


@pytest.fixture
def grade_patched(tmp_path: Path) -> Callable[..., Graded]:
    """Grade a copy of the solution with some edits applied to one file."""

    def run(edits: list[tuple[str, str]], file: str = "question1.py", **kwargs) -> Graded:
        submission = patched_solution(tmp_path / "submission", file, edits)
        kwargs.setdefault("limits", FAST_LIMITS)
        kwargs.setdefault("parts", [p.tag for p in PARTS.values() if p.main_file == file])
        return run_grade(submission, tmp_path / "out", **kwargs)

    return run


def with_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str, body: str) -> Path:
    """The packaged thresholds file with ``table`` (e.g. ``[cpu.part2]``) replaced by
    ``body``, named through ``KVGRADER_THRESHOLDS`` for this test."""
    from grader.core.thresholds import THRESHOLDS_ENV, thresholds_text

    text = thresholds_text()
    start = text.index(table)
    end = text.index("\n[", start + 1) + 1
    path = tmp_path / "thresholds.toml"
    path.write_text(text[:start] + body.strip() + "\n\n" + text[end:])
    monkeypatch.setenv(THRESHOLDS_ENV, str(path))
    return path


@pytest.fixture
def trace_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[dict]]:
    """Every worker request of this test's gradings traced (``KVGRADER_TRACE``): a
    function that reads the trace's lines so far."""
    from grader.runtime.trace import TRACE

    log = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE, str(log))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]


def assert_drawn_at_scales(
    drawn: dict[str, dict], shapes: dict[str, tuple[int, ...]], scale: Callable
) -> None:
    """Each of ``drawn``'s weights (by how they were drawn, then by key) has the mean and
    spread ``scale(name, shape)`` gives, wherever the tensor is large enough to tell."""
    import numpy as np

    for name, shape in shapes.items():
        mean, std = scale(name, shape)
        for how, weights in drawn.items():
            w = np.asarray(weights[name], dtype=np.float64)
            if w.size >= 10_000:
                assert abs(w.std() / std - 1) < 0.05, (how, name, w.std(), std)
                assert abs(w.mean() - mean) < 0.05 * std, (how, name)


def grade_checks(
    submission: Path, out: Path, part: str, numbers: set[str], limits: Limits = FAST_LIMITS
) -> Graded:
    """Grade only the checks ``numbers`` of ``part`` on the CPU."""
    out.mkdir(parents=True)
    return run_grade(
        submission, out, parts=[part], device="cpu", limits=limits, numbers=frozenset(numbers)
    )
