"""Regenerating ``test_cases/`` from ``solution/``, and checking it is up to date.

Everything in ``test_cases/`` is generated with fixed seeds, validated against
its schema and listed with its sha256 in ``manifest.json``. ``check()`` builds
the cases afresh in a temporary folder and reports every file that differs, so
a TA knows whether the committed cases still match the solution.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema

from grader import cases_part1
from grader.context import TEST_CASES
from grader.mutants import SOLUTION, load_mutants

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


def build_part1(solution: Path = SOLUTION) -> dict[str, dict[str, Any]]:
    """Part 1's public and hidden case files."""
    reference = import_path(solution / "question1.py", "_reference_question1")
    mutants: dict[str, ModuleType] = {}
    diagnoses: dict[str, str] = {}
    for mutant in load_mutants("part1"):
        root = mutant.materialise(solution)
        try:
            mutants[mutant.name] = import_path(root / mutant.file, f"_mutant_{mutant.name}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        diagnoses[mutant.name] = mutant.diagnosis
    return cases_part1.build(reference, mutants, diagnoses)


BUILDERS = {"part1": build_part1}


def case_schema(part: str) -> dict[str, Any]:
    text = resources.files("grader").joinpath(f"schemas/{part}_cases.schema.json").read_text()
    return json.loads(text)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_cases(out: Path, solution: Path = SOLUTION) -> list[Path]:
    """Generate every part's cases into ``out`` with a manifest; return the files written."""
    written = []
    for part, builder in BUILDERS.items():
        for visibility, document in builder(solution).items():
            jsonschema.validate(document, case_schema(part))
            path = out / visibility / f"{part}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
            written.append(path)
    manifest = {
        "generated_by": "python -m grader regen",
        "files": {str(p.relative_to(out)): sha256(p) for p in sorted(written)},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return written


def check(cases_root: Path = TEST_CASES, solution: Path = SOLUTION) -> list[str]:
    """Problems with the committed cases: drift from the solution, or from the manifest."""
    problems = []
    manifest_path = cases_root / MANIFEST
    if not manifest_path.is_file():
        return [f"{manifest_path} is missing: run `python -m grader regen`"]
    manifest = json.loads(manifest_path.read_text())
    for rel, digest in manifest["files"].items():
        path = cases_root / rel
        if not path.is_file():
            problems.append(f"{rel}: listed in the manifest but missing")
        elif sha256(path) != digest:
            problems.append(f"{rel}: changed since the manifest was written")
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        try:
            write_cases(fresh, solution)
        except Exception as exc:
            return [*problems, f"cannot regenerate the cases: {exc}"]
        for path in sorted(fresh.rglob("*.json")):
            rel = path.relative_to(fresh)
            committed = cases_root / rel
            if not committed.is_file():
                problems.append(f"{rel}: not committed")
            elif committed.read_bytes() != path.read_bytes():
                problems.append(f"{rel}: differs from what solution/ generates")
    return problems
