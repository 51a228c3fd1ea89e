"""The checks of a grading as a unittest suite, run by gradescope-utils' JSON runner and
read back as dataclasses."""

from __future__ import annotations

import importlib
import inspect
import io
import json
import unittest
from dataclasses import dataclass

from gradescope_utils.autograder_utils.json_test_runner import JSONTestRunner

from grader.checks.base import GradedTestCase
from grader.core.registry import PARTS
from grader.core.results import GradingResults, TestResult
from grader.runtime.context import GradingContext


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


def run_suite(suite: unittest.TestSuite) -> GradingResults:
    """Run checks with gradescope-utils' runner and read its JSON back as dataclasses."""
    stream = io.StringIO()
    JSONTestRunner(stream=stream, failure_prefix="", buffer=True).run(suite)
    data = json.loads(stream.getvalue())
    tests = [TestResult.from_gradescope(t) for t in data["tests"]]
    tests.sort(key=lambda t: [int(x) if x.isdigit() else x for x in t.number.split(".")])
    return GradingResults(tests=tests, leaderboard=data.get("leaderboard", []))
