"""grader/grading/suite.py: the checks of a grading as a unittest suite and the console
lines it prints as each check ends."""

from __future__ import annotations

import importlib
import re
import types
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


def test_each_part_times_its_yardstick_ahead_through_its_first_check_that_compares() -> None:
    """The reference is timed before a part's worker first starts, by the first check in
    the suite's order that compares with it; a part whose selected checks never compare
    times nothing ahead."""
    # Titles name their part's constants: the parts' checks modules import them first.
    for tag in ("part2", "part3"):
        importlib.import_module(f"grader.parts.{tag}.cases")
    from grader.grading.suite import build_suite, yardsticks_ahead
    from grader.judging.base import check

    ctx = types.SimpleNamespace()  # bound to the checks, never used here

    def case(number: str) -> unittest.TestCase:  # timed or not, as its part declares it
        part = "part" + number.split(".")[0]

        @check(number)
        def runTest(self) -> None:
            pass

        def time_yardstick_ahead(self) -> None:
            pass

        attrs = {"part": part, "ctx": ctx, "runTest": runTest}
        attrs["time_yardstick_ahead"] = time_yardstick_ahead
        return type(f"Check{number}", (unittest.TestCase,), attrs)()

    first3 = case("3.7")
    suite = unittest.TestSuite([case("2.1"), case("3.1"), first3, case("3.11"), case("2.8")])
    ahead = yardsticks_ahead(suite)
    assert list(ahead) == ["part3"]  # Part 2's selected checks never compare
    assert ahead["part3"].__self__ is first3

    # The kit's own checks: those that compare say so, the others do not.
    marked = {
        getattr(getattr(t, t._testMethodName), "__number__", "")
        for t in build_suite(ctx, ["part1", "part2", "part3", "part4"])
        if getattr(getattr(t, t._testMethodName), "__yardstick__", False)
    }
    assert marked == {"2.9", "2.11", "3.7", "3.11", "4.6"}
