"""The checks of a grading as a unittest suite, run by gradescope-utils' JSON runner and
read back as dataclasses."""

from __future__ import annotations

import importlib
import inspect
import io
import json
import os
import sys
import time
import unittest
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradescope_utils.autograder_utils.json_test_runner import JSONTestResult, JSONTestRunner

from grader.core.registry import PARTS
from grader.core.results import GradingResults, TestResult
from grader.judging.base import GradedTestCase
from grader.runtime.context import GradingContext
from grader.runtime.trace import at_check
from grader.sandbox.ceiling import ACTIVE


@dataclass(frozen=True)
class Selection:
    """Which checks a grading runs."""

    public_only: bool = False  # leave out the hidden-case checks (a student's self-check)
    tags: frozenset[str] | None = None  # only checks carrying one of these (None: all)
    skip_tags: frozenset[str] = frozenset()  # never checks carrying one of these
    numbers: frozenset[str] | None = None  # only these checks, e.g. {"3.5"} (None: all)


def check_classes(part: str) -> list[type[GradedTestCase]]:
    """The unittest classes that grade ``part``."""
    module = importlib.import_module(PARTS[part].checks_module)
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, GradedTestCase)
        and obj.__module__ == module.__name__
    ]


def build_suite(
    ctx: GradingContext,
    parts: list[str],
    public_only: bool = False,
    tags: frozenset[str] | None = None,
    skip_tags: frozenset[str] = frozenset(),
    numbers: frozenset[str] | None = None,
) -> unittest.TestSuite:
    """The checks of ``parts``, each class bound to this run's context (without the
    hidden-case checks when ``public_only``: a student's self-check; only those
    carrying one of ``tags`` when given, e.g. ``{"benchmark"}`` for calibration; never
    those carrying one of ``skip_tags``; only the checks numbered in ``numbers`` when
    given, e.g. ``{"3.5"}``)."""
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for part in parts:
        for cls in check_classes(part):
            bound = type(cls.__name__, (cls,), {"ctx": ctx, "__module__": cls.__module__})
            for test in loader.loadTestsFromTestCase(bound):
                method = getattr(type(test), test._testMethodName)
                marks = set(getattr(method, "__tags__", ()))
                if public_only and "hidden" in marks:
                    continue
                if (tags is not None and not marks & tags) or marks & skip_tags:
                    continue
                if numbers is not None and getattr(method, "__number__", None) not in numbers:
                    continue
                suite.addTest(test)
    return suite


def parts_run(suite: unittest.TestSuite, bases: dict[str, Path | None]) -> list[str]:
    """The parts whose workers ``suite`` starts, in the order it runs them: those with a
    check in it and their file in the upload (``bases``: the part's folder, or None)."""
    parts: list[str] = []
    for test in suite:
        part = getattr(test, "part", None)
        if part is not None and bases.get(part) is not None and part not in parts:
            parts.append(part)
    return parts


def yardsticks_ahead(suite: unittest.TestSuite) -> dict[str, Callable[[], None]]:
    """Per part, how the first check in ``suite`` that compares with the reference's times
    has them timed before the part's worker first starts
    (:meth:`GradedTestCase.time_yardstick_ahead`); parts with no such check: none."""
    ahead: dict[str, Callable[[], None]] = {}
    for test in suite:
        method = getattr(test, getattr(test, "_testMethodName", ""), None)
        part = getattr(test, "part", None)
        if part and getattr(method, "__yardstick__", False) and part not in ahead:
            ahead[part] = test.time_yardstick_ahead
    return ahead


#: The key of a check's ``extra_data`` that says the grader's memory ceiling stopped it.
MEMORY_STOP = "memory_stop"


def memory_stop_message() -> str:
    """What a check says that ran into the grader's memory ceiling
    (:mod:`grader.sandbox.ceiling`)."""
    headroom = ACTIVE.get("headroom")
    room = f" (the {headroom // 2**20} MiB it keeps for checking)" if headroom else ""
    return (
        f"The grader ran out of memory{room} while it checked what your code returned "
        "here, so this check was stopped and is not graded; the other checks were graded "
        "as usual. What your code returned is likely far larger than asked for (an array "
        "of another shape or type)."
    )


class TracedResult(JSONTestResult):
    """gradescope-utils' result that names each check as it starts, for the lines of a
    grading's trace (:mod:`grader.runtime.trace`), and no check once the run ends. A
    check stopped by the grader's memory ceiling fails with a message that says so."""

    def startTest(self, test: unittest.TestCase) -> None:
        at_check(self.getNumber(test))
        super().startTest(test)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        if err[0] is not None and issubclass(err[0], MemoryError):
            stop = {"error": str(err[1])[:300], "ceiling_bytes": ACTIVE.get("bytes")}
            if isinstance(test, GradedTestCase):  # reported before its tearDown keeps them
                test.note_detail(MEMORY_STOP, stop)
            message = memory_stop_message()
            self.addFailure(test, (AssertionError, AssertionError(message), None))
            return
        super().addError(test, err)

    def stopTestRun(self) -> None:
        at_check(None)
        super().stopTestRun()


class TracedRunner(JSONTestRunner):
    resultclass = TracedResult


class ProgressResult(TracedResult):
    """gradescope-utils' result that also tells the grading's console, as each check ends,
    its verdict and the seconds since the previous one ended (a class's set-up, such as
    the reference's timed prompts, counts in its first check): where a slow grading on
    an unfamiliar machine spends its time."""

    def startTestRun(self) -> None:
        self._began = self._last = time.monotonic()
        super().startTestRun()

    def stopTest(self, test: unittest.TestCase) -> None:
        super().stopTest(test)  # the check's own output is captured until here
        now = time.monotonic()
        entry = self.results[-1] if self.results else {}
        line = f"[{now - self._began:7.1f} s] {entry.get('number', '?'):>5} "
        line += f"{entry.get('status', '?'):6} in {now - self._last:6.1f} s"
        if entry.get("status") == "failed":
            line += "  " + " ".join(entry.get("output", "").split())[:300]
        print(line, file=sys.__stderr__, flush=True)
        self._last = now


class ProgressRunner(JSONTestRunner):
    resultclass = ProgressResult


def run_suite(suite: unittest.TestSuite) -> GradingResults:
    """Run checks with gradescope-utils' runner and read its JSON back as dataclasses;
    with ``KVGRADER_PROGRESS=1`` in the environment each check's verdict and time are
    printed to stderr as it ends."""
    stream = io.StringIO()
    progress = os.environ.get("KVGRADER_PROGRESS") == "1"
    runner = ProgressRunner if progress else TracedRunner
    runner(stream=stream, failure_prefix="", buffer=True).run(suite)
    data = json.loads(stream.getvalue())
    tests = [TestResult.from_gradescope(t) for t in data["tests"]]
    tests.sort(key=lambda t: [int(x) if x.isdigit() else x for x in t.number.split(".")])
    return GradingResults(tests=tests, leaderboard=data.get("leaderboard", []))
