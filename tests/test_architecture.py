"""The trust boundary, as import-linter checks it (``make lint`` runs the same contracts):
the worker side, which runs beside student code, imports nothing of the grader's side,
and the grader's side imports nothing of the worker's but the wire protocol."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def modules_of(package: Path) -> set[str]:
    """Every importable module under ``package`` (a folder without ``__init__.py`` is not)."""
    found = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if not all(
            (package.parent / Path(*parts[:i]) / "__init__.py").is_file()
            for i in range(1, len(parts))
        ):
            continue
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def covered(module: str, listed: list[str]) -> bool:
    return any(module == m or module.startswith(m + ".") for m in listed)


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the package under ``root`` with the project's configuration."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def worker_side(module: str) -> bool:
    return covered(module, ["grader.worker"]) or module.endswith(".adapter")


def test_the_contracts_name_every_module_of_each_side() -> None:
    outward, inward = contracts()
    modules = modules_of(ROOT / "grader") - {"grader", "grader.__main__"}
    worker = {m for m in modules if worker_side(m)}
    trusted = (
        modules
        - worker
        - {"grader.parts.part1", "grader.parts.part2", "grader.parts.part3", "grader.parts.part4"}
    )
    assert {f"grader.parts.part{n}.adapter" for n in range(1, 5)} <= worker
    assert all(covered(m, outward["source_modules"]) for m in worker)
    assert all(covered(m, outward["forbidden_modules"]) for m in trusted), sorted(
        m for m in trusted if not covered(m, outward["forbidden_modules"])
    )
    assert all(covered(m, inward["source_modules"]) for m in trusted)
    allowed = {"grader.worker", "grader.worker.protocol"}  # the package and the wire format
    assert all(covered(m, inward["forbidden_modules"]) for m in worker - allowed)


def test_both_sides_keep_the_contracts() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "2 kept, 0 broken" in proc.stdout


def copy_of_grader(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "grader", tmp_path / "grader", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path / "grader"


@pytest.mark.parametrize(
    ("module", "line", "named"),
    [
        # the worker side reaching into the grader
        ("parts/part1/adapter.py", "from grader.runner import grade", "grader.runner"),
        # the grader's side reaching into the worker side
        (
            "parts/part3/checks.py",
            "from grader.parts.part3 import adapter",
            "grader.parts.part3.adapter",
        ),
    ],
)
def test_an_import_across_the_boundary_breaks_it(
    tmp_path: Path, module: str, line: str, named: str
) -> None:
    path = copy_of_grader(tmp_path) / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0
    assert "BROKEN" in proc.stdout and named in proc.stdout
