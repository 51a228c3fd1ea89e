"""The architecture as import-linter checks it (``make lint`` runs the same contracts): each
folder of ``grader/`` is a layer that imports only downward, the parts are independent,
the worker side imports nothing of the parent and the parent nothing of the worker side
but the wire protocol, and no modules import each other in a cycle. The contracts name
folders, not modules, so a new module is covered by the rules of the folder it lands in."""

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
CONTRACTS = 5


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


def test_every_module_lies_in_a_layer() -> None:
    (layers,) = [c for c in contracts() if c["type"] == "layers"]
    assert len(contracts()) == CONTRACTS
    in_layer = {m for m in modules_of(ROOT / "grader") for layer in layers["layers"]
                if m == layer or m.startswith(layer + ".")}  # fmt: skip
    assert modules_of(ROOT / "grader") - in_layer == {"grader", "grader.__main__"}
    # the contracts are rules over folders: no module is listed by hand
    for contract in contracts():
        keys = ("layers", "modules", "source_modules", "forbidden_modules", "protected_modules",
                "allowed_importers")  # fmt: skip
        for key in keys:
            assert all(m.count(".") == 1 or "*" in m for m in contract.get(key, [])), contract


def test_the_project_keeps_every_contract() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{CONTRACTS} kept, 0 broken" in proc.stdout


def copy_of_grader(tmp_path: Path) -> Path:
    """The package and the contracts' own code (``tools/``) under ``tmp_path``."""
    for name in ("grader", "tools"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "grader"


# New modules, named in no contract: each breaks the rule of the folder it lands in.
BREAKS = {
    "a runtime module reaching up into grading": (
        {"runtime/newmodule.py": "from grader.grading import runner\n"},
        "Layers",
    ),
    "a core module reaching up into the sandbox": (
        {"core/newmodule.py": "import grader.sandbox.processes\n"},
        "Layers",
    ),
    "the worker side reaching into the grader": (
        {"parts/part1/adapter.py": "from grader.core import results  # noqa\n"},
        "worker side",
    ),
    "a check importing a worker-side module": (
        {"judging/newmodule.py": "from grader.parts.part3 import adapter\n"},
        "wire protocol",
    ),
    "a new worker-side module reaching into the grader": (
        {"parts/part4/adapter_new.py": "from grader.runtime import timing  # noqa\n"},
        "worker side",
    ),
    "a check importing a worker-side module named in no contract": (
        {"judging/newmodule.py": "from grader.parts.part4 import adapter_latency\n"},
        "wire protocol",
    ),
    "one part importing another": (
        {"parts/part2/newmodule.py": "from grader.parts.part3 import cases\n"},
        "independent",
    ),
    "two sibling modules importing each other": (
        {
            "ta/first.py": "from grader.ta import second\n",
            "ta/second.py": "from grader.ta import first\n",
        },
        "cycles",
    ),
}


@pytest.mark.parametrize("case", list(BREAKS), ids=list(BREAKS))
def test_a_new_module_that_breaks_a_rule_is_caught(tmp_path: Path, case: str) -> None:
    files, contract = BREAKS[case]
    package = copy_of_grader(tmp_path)
    for rel, line in files.items():
        path = package / rel
        path.write_text((path.read_text() if path.exists() else "") + line)
    proc = lint(tmp_path)
    assert proc.returncode != 0
    broken = [line for line in proc.stdout.splitlines() if line.endswith(" BROKEN")]
    # an upward import also closes a cycle between sibling folders: both rules report it
    assert any(contract in line for line in broken), proc.stdout[-3000:]


def test_a_new_module_that_imports_downward_keeps_them(tmp_path: Path) -> None:
    package = copy_of_grader(tmp_path)
    (package / "judging" / "newmodule.py").write_text(
        "from grader.core import points\nfrom grader.runtime import timing\n"
        "from grader.worker import protocol\n"
    )
    proc = lint(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{CONTRACTS} kept, 0 broken" in proc.stdout


def test_worker_side_modules_import_nothing_of_the_grader() -> None:
    """They run as flat copies in the sandbox, where ``grader`` is not importable: an adapter
    names only its own modules beside it (``adapter_*.py``, copied flat beside it)."""
    import grimp

    graph = grimp.build_graph("grader", cache_dir=None)
    worker = {m for m in graph.modules if m.startswith("grader.worker") or ".adapter" in m}
    assert {f"grader.parts.part{n}.adapter" for n in range(1, 5)} <= worker
    folder = {m: m.rsplit(".", 1)[0] for m in worker}
    imports = {m: graph.find_modules_directly_imported_by(m) for m in worker}
    beside = {
        m: {i for i in found if i in worker and folder[i] == folder[m]}
        for m, found in imports.items()
    }
    assert {m: found - beside[m] for m, found in imports.items()} == {m: set() for m in worker}
    assert not any(beside[m] for m in worker if m.startswith("grader.worker"))
