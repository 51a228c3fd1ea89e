"""The README's commands work when pasted into a plain shell (no venv activated)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
KVGRADER = Path(sys.executable).parent / "kvgrader"
PLAIN_SHELL = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}

SUBCOMMANDS = sorted(set(re.findall(r"\.venv/bin/kvgrader ([a-z-]+)", README)))
# In inline code, at the start of a code line, or after another command's "|".
MAKE_TARGETS = sorted(
    set(re.findall(r"(?:`|^|\| )make ([a-z][a-z-]+)(?![\w'])", README, re.MULTILINE))
)
SCRIPTS = sorted(set(re.findall(r"\.venv/bin/python ((?:benchmarks|solution)/[\w/]+\.py)", README)))


def test_the_readme_names_the_ta_commands() -> None:
    assert {"grade", "regen", "mutants", "build", "run-local", "batch"} <= set(SUBCOMMANDS)
    assert {"grade", "test", "dist", "run-local", "batch", "lock"} <= set(MAKE_TARGETS)


def in_plain_shell(*command: str) -> subprocess.CompletedProcess:
    """``command`` run from the checkout with only a system PATH (no venv activated)."""
    return subprocess.run(
        list(command), cwd=ROOT, env=PLAIN_SHELL, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_kvgrader_subcommand_runs_from_a_plain_shell(subcommand: str) -> None:
    proc = in_plain_shell(str(KVGRADER), subcommand, "--help")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("target", MAKE_TARGETS)
def test_make_target_exists(target: str) -> None:
    proc = in_plain_shell("make", "-n", target, "EXPORT=export")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_named_in_the_readme_exist(script: str) -> None:
    assert (ROOT / script).is_file()


def test_every_kvgrader_command_is_written_with_its_path() -> None:
    # `kvgrader` alone is not on a plain shell's PATH: the README writes .venv/bin/kvgrader
    assert not re.findall(r"(?<![/\w])kvgrader [a-z-]+", README)


def test_a_bare_make_prints_the_targets_each_with_one_line() -> None:
    bare, helped = in_plain_shell("make"), in_plain_shell("make", "help")
    assert bare.returncode == 0 and "Nothing to be done" not in bare.stdout + bare.stderr
    assert bare.stdout == helped.stdout
    listed = set(re.findall(r"^  make ([a-z][a-z-]+)", helped.stdout, re.MULTILINE))
    assert {"help", "grade", "test", "dist", "run-local", "batch", "lint"} <= listed
    for target in listed:
        assert in_plain_shell("make", "-n", target, "EXPORT=export").returncode == 0, target
