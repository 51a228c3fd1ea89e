"""Regenerating ``test_cases/`` from ``solution/``, and checking it is up to date.

Everything in ``test_cases/`` is generated with fixed seeds, validated against
its schema and listed with its sha256 in ``manifest.json``. ``check()`` builds
the cases afresh in a temporary folder and reports every file that differs, so
a TA knows whether the committed cases still match the solution.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Collection, Iterator
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from grader.core.paths import SOLUTION, TEST_CASES
from grader.core.registry import PARTS
from grader.ta import handout, skeleton
from grader.ta.case_compare import compare_files
from grader.ta.mutants import load_mutants

MANIFEST = "manifest.json"


def import_path(path: Path, name: str) -> ModuleType:
    """Import a trusted file (the reference or one of its mutants) under a unique name."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


# What a builder returns: relative path -> (schema name or None, JSON document or raw bytes).
CaseFiles = dict[str, tuple[str | None, Any]]


def reference_and_mutants(
    part: str, main_file: str, solution: Path
) -> tuple[ModuleType, dict[str, ModuleType], dict[str, str]]:
    """The reference module, every mutant of ``part`` as a module, and their diagnoses."""
    stem = Path(main_file).stem
    reference = import_path(solution / main_file, f"_reference_{stem}")
    mutants: dict[str, ModuleType] = {}
    diagnoses: dict[str, str] = {}
    for mutant in load_mutants(part, combined=False):  # the catalogue holds single mistakes
        root = mutant.materialise(solution)
        try:
            mutants[mutant.name] = import_path(root / mutant.file, f"_mutant_{mutant.name}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        diagnoses[mutant.name] = mutant.diagnosis
    return reference, mutants, diagnoses


def build_part1(solution: Path = SOLUTION) -> CaseFiles:
    """Part 1's public and hidden case files."""
    from grader.parts.part1 import build as part1
    from grader.parts.part1.combine import Combiner

    library = load_mutants("part1", combined=False)
    singles = {m.name: m.edits for m in library if m.file == "question1.py"}
    combiner = Combiner((solution / "question1.py").read_text(), singles)
    reference, mutants, diagnoses = reference_and_mutants("part1", "question1.py", solution)
    documents = part1.build(reference, mutants, diagnoses, combiner)
    return {f"{vis}/part1.json": ("part1_cases", doc) for vis, doc in documents.items()}


def build_part2(solution: Path = SOLUTION) -> CaseFiles:
    """Part 2's metadata, course-format public cases, weights file and hidden cases."""
    from grader.parts.part2 import build as part2

    return part2.build(*reference_and_mutants("part2", "transformer_skeleton.py", solution))


def build_part3(solution: Path = SOLUTION) -> CaseFiles:
    """Part 3's tiny checkpoint, metadata with the diagnosis catalogue, and hidden cases."""
    from grader.parts.part3 import build as part3

    roots: dict[str, Path] = {}
    try:
        singles = load_mutants("part3", combined=False)  # the catalogue holds single mistakes
        for mutant in singles:
            roots[mutant.name] = mutant.materialise(solution)
        diagnoses = {m.name: m.diagnosis for m in singles}
        # The tokenizer announces every load on stdout, as Meta's does: keep regen quiet.
        with contextlib.redirect_stdout(io.StringIO()):
            return part3.build(solution, roots, diagnoses)
    finally:
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


def build_part4(solution: Path = SOLUTION) -> CaseFiles:
    """Part 4's hidden prompts with the reference's tokens and logits, and its catalogue."""
    from grader.parts.part4 import build as part4

    return part4.build(*reference_and_mutants("part4", "kv_lab.py", solution))


BUILDERS = {
    "part1": build_part1,
    "part2": build_part2,
    "part3": build_part3,
    "part4": build_part4,
}


def case_schema(name: str) -> dict[str, Any]:
    """The JSON schema ``schemas/<name>.schema.json`` (``name`` like "part1_cases")."""
    if not name.endswith("cases"):
        name = f"{name}_cases"
    text = resources.files("grader.core").joinpath(f"schemas/{name}.schema.json").read_text()
    return json.loads(text)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def serialise(rel: str, payload: Any) -> bytes:
    """Bytes of a case file: JSON documents sorted and indented (compact when large)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, list):  # the course-format case list: large, kept compact
        return (json.dumps(payload, separators=(",", ":")) + "\n").encode()
    return (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread while cases are built: the sums are then done in the same
    order on every machine (so ``--check`` agrees across core counts), and a busy
    machine cannot make OpenMP workers spin against each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: The part builders, slowest first (each part's ``regen_order``): started in this order,
#: the slowest never waits for a free process.
BUILD_ORDER = tuple(sorted(PARTS, key=lambda tag: PARTS[tag].ta.regen_order))


def _build_one(name: str, solution: Path) -> Any:
    """One part's cases, built on one torch thread (run in a worker process)."""
    with one_thread():
        return BUILDERS[name](solution)


def build_all(names: list[str], solution: Path) -> list[Any]:
    """The cases of the parts ``names``, in that order: the parts are independent, so on
    a machine with several cores they are built in as many processes at once (each on
    one torch thread, so the numbers are those of a build in this process)."""
    jobs = min(len(names), os.cpu_count() or 1)
    if jobs <= 1:
        return [_build_one(name, solution) for name in names]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    started = sorted(names, key=lambda n: BUILD_ORDER.index(n) if n in BUILD_ORDER else 0)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(_build_one, name, solution) for name in started}
        return [futures[name].result() for name in names]


def write_cases(
    out: Path, solution: Path = SOLUTION, parts: Collection[str] | None = None
) -> list[Path]:
    """Generate the cases of ``parts`` (default: every part) into ``out`` with a manifest;
    return the files written. With ``parts``, the manifest keeps the entries of the files
    the other parts wrote there before, so one part can be regenerated on its own."""
    written = []
    names = [name for name in BUILDERS if parts is None or name in parts]
    for files in build_all(names, solution):
        for rel, (schema, payload) in files.items():
            if schema is not None:
                jsonschema.validate(payload, case_schema(schema))
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(serialise(rel, payload))
            written.append(path)
    files = {p.relative_to(out).as_posix(): sha256(p) for p in sorted(written)}
    if parts is not None and (out / MANIFEST).is_file():
        before = json.loads((out / MANIFEST).read_text()).get("files", {})
        kept = {rel: digest for rel, digest in before.items() if (out / rel).is_file()}
        files = {**kept, **files}
    manifest = {"generated_by": "python -m grader regen", "files": files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return written


def check(
    cases_root: Path = TEST_CASES,
    solution: Path = SOLUTION,
    fresh: Path | None = None,
    assignment: Path | None = None,
    parts: Collection[str] | None = None,
) -> list[str]:
    """Problems with the committed cases: drift from the solution, or from the manifest.

    Regenerated files are compared with the committed ones by meaning
    (:mod:`grader.ta.case_compare`), so cases committed on one CPU are still up to
    date on another, while a changed solution or case builder is reported.
    ``fresh`` is a folder already written by :func:`write_cases` from ``solution``
    (so several checks can share one regeneration). The skeletons in ``assignment``
    (default ``assignment/``) are generated from ``solution`` too and checked first.
    ``parts`` limits the regeneration (and so the drift reported) to those parts.
    """
    problems = skeleton.check(assignment, solution)
    if assignment is None:  # the handout's grading tables, from the parts' declarations
        problems += [
            f"assignment/README.md: {tag}'s '{handout.HEADING}' table differs from "
            f"grader/parts/{tag}/part.toml" for tag in handout.stale_tables()
        ]  # fmt: skip
    manifest_path = cases_root / MANIFEST
    if not manifest_path.is_file():
        return [*problems, f"{manifest_path} is missing: run `python -m grader regen`"]
    manifest = json.loads(manifest_path.read_text())
    for rel, digest in manifest["files"].items():
        path = cases_root / rel
        if not path.is_file():
            problems.append(f"{rel}: listed in the manifest but missing")
        elif sha256(path) != digest:
            problems.append(f"{rel}: changed since the manifest was written")
    with tempfile.TemporaryDirectory() as tmp:
        if fresh is None:
            fresh = Path(tmp)
            try:
                write_cases(fresh, solution, parts)
            except Exception as exc:
                return [*problems, f"cannot regenerate the cases: {exc}"]
        problems += drift(cases_root, fresh)
    return problems


def drift(cases_root: Path, fresh: Path) -> list[str]:
    """Every file of ``fresh`` that is missing from ``cases_root`` or means something else."""
    problems = []
    for path in sorted(p for p in fresh.rglob("*") if p.is_file()):
        rel = path.relative_to(fresh).as_posix()
        committed = cases_root / rel
        if rel == MANIFEST:
            continue  # its checksums follow the bytes; the files are compared by meaning
        if not committed.is_file():
            problems.append(f"{rel}: not committed")
            continue
        difference = compare_files(rel, path.read_bytes(), committed.read_bytes())
        if difference:
            problems.append(f"{rel}: differs from what solution/ generates ({difference})")
    return problems
