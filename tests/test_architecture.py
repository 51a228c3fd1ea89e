"""The trust boundary, as import-linter checks it (``make lint`` runs the same contract):
the worker side, which runs beside student code, imports nothing of the grader's side."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return config["contracts"][0]


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


def test_the_contract_names_every_module_of_the_trusted_side() -> None:
    package = ROOT / "grader"
    modules = {f"grader.{p.stem}" for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {f"grader.{p.name}" for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert modules - {"grader.worker", "grader.__main__"} <= set(contract()["forbidden_modules"])


def test_the_worker_keeps_the_contract() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def test_a_worker_module_importing_the_grader_breaks_it(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "grader", tmp_path / "grader", ignore=shutil.ignore_patterns("__pycache__")
    )
    adapter = tmp_path / "grader" / "worker" / "adapter_part1.py"
    adapter.write_text(adapter.read_text() + "\nfrom grader.runner import grade  # noqa\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0
    assert "BROKEN" in proc.stdout and "grader.runner" in proc.stdout
