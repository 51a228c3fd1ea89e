"""The locks: every package of the image pinned exactly, resolvable for the image's Python
and platform, true to pyproject.toml, and installed as such in the development venv."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("lock")

IMAGE_LOCK = ROOT / "requirements" / "image.txt"
DEV_LOCK = ROOT / "requirements" / "dev.txt"
IMAGE_PYTHON = "3.11"
# Ubuntu 22.04 (glibc 2.35) on x86_64: every manylinux tag it can run.
IMAGE_PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in range(35, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pins(lock: Path) -> dict[str, str]:
    """name -> exact version of every requirement line of a lock."""
    out = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith(("#", " ", "-")):
            name, _, version = line.partition("==")
            assert version, f"{lock.name}: {line!r} is not pinned exactly"
            out[canonicalize_name(name)] = version
    return out


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_image_lock_satisfies_every_runtime_dependency() -> None:
    locked = pins(IMAGE_LOCK)
    for line in project()["dependencies"]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in the lock: run `make lock`"
        assert req.specifier.contains(locked[name], prereleases=True), (line, locked[name])
    assert locked["torch"].endswith("+cpu")  # the CPU build, never CUDA
    assert not any(name.startswith("nvidia-") for name in locked)


def test_the_dev_lock_holds_the_image_versions_and_the_dev_tools() -> None:
    image, dev = pins(IMAGE_LOCK), pins(DEV_LOCK)
    assert {k: dev.get(k) for k in image} == image
    for line in project()["optional-dependencies"]["dev"]:
        assert canonicalize_name(Requirement(line).name) in dev


def test_the_development_venv_has_exactly_the_locked_versions() -> None:
    """What is tested and calibrated here is what the image installs."""
    wrong = {}
    for name, version in pins(DEV_LOCK).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        if installed != version:
            wrong[name] = (installed, version)
    assert wrong == {}, "run `make venv` (installed, locked)"


def test_requires_python_is_true_of_every_pin() -> None:
    """The project's floor is a Python that every locked package supports."""
    floor = SpecifierSet(project()["requires-python"])
    assert floor.contains(IMAGE_PYTHON) and not floor.contains("3.10")
    for name in pins(IMAGE_LOCK):
        needs = metadata.metadata(name).get("Requires-Python")
        if needs:
            assert SpecifierSet(needs).contains(IMAGE_PYTHON), (name, needs)


def dry_run(python_version: str, lock_lines: list[str], *index: str) -> subprocess.CompletedProcess:
    """pip's answer to "could these exact wheels be installed on the image?"."""
    platforms = [arg for p in IMAGE_PLATFORMS for arg in ("--platform", p)]
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--only-binary=:all:", "--python-version", python_version, *platforms,
         "--target", "/nonexistent", "--retries", "2", "--disable-pip-version-check",
         *index, *lock_lines],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """What a dry run said: its exit status and its messages."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def pip_answer(request: pytest.FixtureRequest) -> Callable[..., Answer]:
    """:func:`dry_run`, its answer kept in pytest's cache under everything it depends on
    (the request, pip's version), when ``expected`` accepts it: a warm run of the suite on
    an unchanged lock asks the package index once, and a fresh checkout (CI) or ``pytest
    --cache-clear`` always asks. An answer the test would reject (a network failure
    included) is never kept."""

    def ask(
        python_version: str, lines: list[str], *index: str, expected: Callable[[Answer], bool]
    ) -> Answer:
        request_text = json.dumps([python_version, IMAGE_PLATFORMS, lines, index])
        key = hashlib.sha256(f"{request_text}{metadata.version('pip')}".encode()).hexdigest()
        name = f"lock-dry-run/{key[:32]}"
        kept = request.config.cache.get(name, None)
        if kept is not None:
            return Answer(**kept)
        proc = dry_run(python_version, lines, *index)
        answer = Answer(proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
        if expected(answer):
            request.config.cache.set(name, asdict(answer))
        return answer

    return ask


@pytest.fixture(scope="module")
def lock_lines() -> list[str]:
    return [f"{name}=={version}" for name, version in pins(IMAGE_LOCK).items()]


def resolved(answer: Answer) -> bool:
    return answer.returncode == 0


def unresolvable(answer: Answer) -> bool:
    return answer.returncode != 0 and (
        "No matching distribution" in answer.stderr or "Requires-Python" in answer.stderr
    )


def test_the_image_lock_resolves_for_the_images_python_and_platform(
    lock_lines: list[str], pip_answer: Callable[..., Answer]
) -> None:
    torch = [line for line in lock_lines if line.startswith("torch==")]
    rest = [line for line in lock_lines if not line.startswith("torch==")]
    answer = pip_answer(IMAGE_PYTHON, rest, expected=resolved)
    assert resolved(answer), answer.stdout + answer.stderr
    answer = pip_answer(IMAGE_PYTHON, torch, "--index-url", CPU_INDEX, expected=resolved)
    assert resolved(answer), answer.stdout + answer.stderr


def test_the_same_lock_does_not_resolve_for_ubuntus_own_python(
    lock_lines: list[str], pip_answer: Callable[..., Answer]
) -> None:
    """Why setup.sh installs 3.11: the system python3 of 22.04 (3.10) cannot take the lock."""
    rest = [line for line in lock_lines if not line.startswith("torch==")]
    answer = pip_answer("3.10", rest, expected=unresolvable)
    assert unresolvable(answer), answer.stdout + answer.stderr


GROUPED = """
import pytest
pytestmark = pytest.mark.xdist_group("together")
def test_first(): pass
def test_second(): pass
"""
ALONE = "def test_third(): pass\ndef test_fourth(): pass\n"


def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path: Path) -> None:
    """``make test`` shares expensive fixtures through xdist_group marks (--dist loadgroup):
    with a pytest that pytest-xdist cannot tag, the groups are silently split."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_alone.py").write_text(ALONE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
         "no:cacheprovider", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    workers = {
        line.split("::")[-1].split()[0]: line.split("]")[0].strip("[")
        for line in proc.stdout.splitlines()
        if "PASSED" in line
    }
    assert set(workers) == {"test_first@together", "test_second@together", "test_third",
                            "test_fourth"}, proc.stdout[-2000:]  # fmt: skip
    assert workers["test_first@together"] == workers["test_second@together"]
