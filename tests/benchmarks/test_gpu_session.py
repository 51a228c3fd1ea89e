"""benchmarks/gpu_session.sh, the prepared run for a lent GPU: every grader command in it
parses with today's command line, so the script cannot rot between GPU sessions."""

from __future__ import annotations

import re
import shlex
import subprocess

from grader.cli import build_parser
from tests.conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"


def grader_commands() -> list[list[str]]:
    """Each ``python3 -m grader ...`` command of the script, continuation lines joined and
    its variables given example values."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    text = text.replace('"$OUT', '"results/gpu').replace('"$RUNS"', "2")
    commands = []
    for line in text.splitlines():
        found = re.search(r"python3 -m grader (.*?)(?:>|$)", line)
        if found and not line.lstrip().startswith("#"):
            commands.append(shlex.split(found.group(1)))
    return commands


def test_the_script_is_valid_shell() -> None:
    assert subprocess.run(["sh", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_every_grader_command_parses() -> None:
    commands = grader_commands()
    assert [c[0] for c in commands] == ["grade", "calibrate"]
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        assert args.device == "cuda"
