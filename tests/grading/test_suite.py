"""grader/grading/suite.py: the checks of a grading as a unittest suite and the console
lines it prints as each check ends."""

from __future__ import annotations

import re
import unittest
from pathlib import Path

import pytest

from tests.conftest import grade_checks


def test_progress_lines_name_each_check_its_verdict_and_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``KVGRADER_PROGRESS=1``: a line on the console per check as it ends (where a slow
    grading on an unfamiliar machine spends its time), the failed one with its reason;
    the results are the same as without."""
    monkeypatch.setenv("KVGRADER_PROGRESS", "1")
    broken = tmp_path / "broken"
    broken.mkdir()
    graded = grade_checks(broken, tmp_path / "out", "part1", {"1.1", "1.2"})
    err = capfd.readouterr().err
    found = [
        re.match(r"\[ *\d+\.\d s\] +(\S+) +(\S+) +in +\d+\.\d s +(.*)", line)
        for line in err.splitlines()
    ]
    verdicts = [m.groups() for m in found if m]
    assert [v[:2] for v in verdicts] == [("1.1", "failed"), ("1.2", "failed")], err
    assert all(reason for _, _, reason in verdicts), verdicts  # the failure's first words
    assert graded.score("1.1") == 0


def test_the_parts_run_are_those_with_a_check_and_a_file_in_the_suites_order() -> None:
    """What a grading's fork server may import ahead follows the parts whose workers the
    suite starts: a part with no check selected, or whose file is missing, starts none."""
    from grader.grading.suite import parts_run

    def check(part: str) -> unittest.TestCase:
        cls = type(f"Check{part}", (unittest.TestCase,), {"part": part, "runTest": lambda s: None})
        return cls()

    suite = unittest.TestSuite([check("part3"), check("part1"), check("part3"), check("part4")])
    folder = Path("/sub")
    bases = {"part1": folder, "part3": folder, "part4": None}
    assert parts_run(suite, bases) == ["part3", "part1"]
    assert parts_run(unittest.TestSuite(), bases) == []
