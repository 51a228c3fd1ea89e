"""benchmarks/gpu_session.sh, the prepared run for a lent GPU: every grader command in it
parses with today's command line, so the script cannot rot between GPU sessions."""

from __future__ import annotations

import re
import shlex
import subprocess

from grader.cli import build_parser
from grader.ta.regen import import_path
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
    assert [c[0] for c in commands] == ["grade"]
    parser = build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        assert args.device == "cuda"


def test_the_stability_command_parses() -> None:
    """The rounds side by side on the GPU: the stability script's own command line."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    found = re.search(r"python3 benchmarks/verdict_stability.py (.*?)>", text)
    assert found is not None
    argv = shlex.split(found.group(1).replace('"$deadline"', "300").replace('"$OUT', '"out'))
    stability = import_path(ROOT / "benchmarks" / "verdict_stability.py", "stability_for_gpu")
    args = stability.build_parser().parse_args(argv)
    assert (args.device, args.condition, args.extra_baselines) == ("cuda", "paired", True)
    assert args.deadline == 300
