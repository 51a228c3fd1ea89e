"""Grading one submission: copy it into a sandbox, run the checks, write results.json.

``grade()`` is the whole pipeline. Whatever happens inside (a missing file, a
hostile submission, a bug in the grader itself) the workers are stopped first
and a valid results file is written last, in a ``finally``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import json
import os
import sys
import threading
import time
import traceback
import unittest
from collections.abc import Callable
from pathlib import Path

from gradescope_utils.autograder_utils.json_test_runner import JSONTestRunner

from grader.checks.base import GradedTestCase
from grader.core.paths import PROJECT_ROOT, SOLUTION, TEST_CASES
from grader.core.points import part_total
from grader.core.registry import PARTS
from grader.core.results import (
    GradingResults,
    TestResult,
    fallback_results,
    reserve_results,
    write_results,
)
from grader.core.thresholds import leaderboard_entries, leaderboard_settings, resolve_device
from grader.runtime.context import GradingContext
from grader.sandbox.identity import RUN_RECORD_ENV
from grader.sandbox.mounts import mount_isolation
from grader.sandbox.sandbox import (
    Limits,
    Sandbox,
    WorkerIdentity,
    kill_user_processes,
    network_isolation,
    protect_hidden,
)
from grader.sandbox.submission import copy_submission, locate


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


def summary(results: GradingResults, notes: list[str]) -> str:
    """The top-of-page text a student sees on Gradescope."""
    lines = []
    for part, (score, max_score) in results.by_part().items():
        title = PARTS[part].title if part in PARTS else part
        lines.append(f"{part} ({title}): {score:g} / {max_score:g}")
    lines.append(f"Total: {results.score:g} / {results.max_score:g}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def record_identity(sandbox: Sandbox) -> None:
    """Write the worker's uid and run gid where a supervising batch asked for them."""
    target = os.environ.get(RUN_RECORD_ENV)
    if target and sandbox.identity.dropped:
        Path(target).write_text(
            json.dumps({"uid": sandbox.identity.uid, "gid": sandbox.identity.gid})
        )


class Watchdog:
    """The whole grading's deadline, kept by a thread the submission cannot block.

    When it passes, ``on_expire`` stops the run's workers: whatever check is
    waiting on one fails at once, the rest fail fast, and the results are
    written as usual. If the grader still has not finished ``grace_s`` later,
    the thread writes a valid results file itself and ends the process.
    """

    def __init__(
        self,
        seconds: float,
        on_expire: Callable[[], None],
        results_path: Path,
        max_score: float,
        grace_s: float = 60.0,
    ) -> None:
        self.seconds, self.grace_s = seconds, grace_s
        self.on_expire, self.results_path, self.max_score = on_expire, results_path, max_score
        self.done = threading.Event()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def finish(self) -> None:
        self.done.set()
        self._timer.cancel()

    def _expire(self) -> None:
        with contextlib.suppress(Exception):
            self.on_expire()
        if self.done.wait(self.grace_s):
            return
        write_results(
            fallback_results(
                f"The grading did not finish within {self.seconds:.0f} s and was stopped. "
                "This is not your fault if your code is quick; please tell the course staff.",
                max_score=self.max_score,
            ),
            self.results_path,
        )
        os._exit(1)


def grade(
    submission: Path,
    *,
    results_path: Path,
    parts: list[str] | None = None,
    device: str = "auto",
    limits: Limits | None = None,
    cases_root: Path = TEST_CASES,
    identity: WorkerIdentity | None = None,
    public_only: bool = False,
    tags: frozenset[str] | None = None,
    hide: tuple[Path, ...] = (),
    skip_tags: frozenset[str] = frozenset(),
    numbers: frozenset[str] | None = None,
) -> GradingResults | None:
    """Grade ``submission`` and write ``results_path``; return the results (None on a crash).

    ``device`` ("auto", "cpu" or "cuda") is where the submission runs and which
    benchmark threshold profile applies; ``tags`` keeps only the checks carrying one;
    ``hide`` names folders the worker must not see besides the grader's own (an export);
    ``numbers`` keeps only those checks.
    """
    parts = parts or list(PARTS)
    started = time.monotonic()
    results: GradingResults | None = None
    crash = ""
    sandbox: Sandbox | None = None
    ctx: GradingContext | None = None
    watchdog: Watchdog | None = None
    total = sum(part_total(p) for p in parts if p in PARTS)
    try:
        with contextlib.suppress(OSError):
            reserve_results(
                results_path,
                "The autograder did not finish grading your submission. This is not your "
                "fault; please tell the course staff.",
                max_score=total,
            )
        sandbox = Sandbox.create(identity)
        record_identity(sandbox)
        limits = limits or Limits()

        def stop_workers() -> None:  # the deadline passed: nothing more of the submission runs
            sandbox.expired.set()
            if ctx is not None:
                ctx.kill_workers()
            kill_user_processes(sandbox.identity)

        watchdog = Watchdog(limits.grading_timeout_s, stop_workers, results_path, total)
        watchdog.start()
        protect_hidden(Path(cases_root) / "hidden", sandbox.identity)
        protect_hidden(SOLUTION, sandbox.identity)  # absent from the autograder zip
        isolation = network_isolation()
        if limits.isolate_network and isolation:
            sandbox.warnings.append(f"the worker keeps the network: {isolation}")
        # The grader's own files (a checkout's .git holds the solution) and whatever the
        # caller names (a batch's export) are covered in the worker's view.
        sandbox.hidden = [PROJECT_ROOT, *(Path(h) for h in hide)]
        if sandbox.identity.dropped and mount_isolation():
            sandbox.warnings.append(f"the worker sees the grader's files: {mount_isolation()}")
        copied = copy_submission(Path(submission), sandbox.submission_dir)
        sandbox.hand_over()
        bases = {p: locate(sandbox.submission_dir, PARTS[p].main_file) for p in parts}
        device = resolve_device(device)
        ctx = GradingContext(
            sandbox=sandbox,
            limits=limits,
            device=device,
            bases=bases,
            cases_root=cases_root,
            # One thread: on a shared or fractional CPU (Gradescope gives 1/2 a core)
            # more threads than cores makes torch's OpenMP workers spin against
            # each other, turning milliseconds into seconds.
            threads=int(os.environ.get("KVGRADER_THREADS", "1")),
        )
        results = run_suite(build_suite(ctx, parts, public_only, tags, skip_tags, numbers))
        benchmarks = {num: rec.summary() for num, rec in sorted(ctx.benchmarks.items())}
        notes = [
            f"{PARTS[p].main_file} was not found in your submission, so {p} scores 0."
            for p, base in bases.items()
            if base is None
        ]
        notes += [f"Not graded: {r}" for r in copied.refused]
        if benchmarks:
            notes.append(
                f"Benchmark checks ({', '.join(benchmarks)}) were timed on {device} and judged "
                f"with the {device} threshold profile."
            )
        if sandbox.expired.is_set():
            notes.append(
                f"The grading ran past its {limits.grading_timeout_s:.0f} s budget: the "
                "check running then was stopped and the ones after it were not run."
            )
        results.output = summary(results, notes)
        results.extra_data = {
            "device": device,
            "benchmark_profile": device,
            "benchmarks": benchmarks,
            "parts": parts,
            "worker_user": sandbox.identity.name,
            "sandbox_warnings": sandbox.warnings,
        }
        results.leaderboard = leaderboard_entries(benchmarks, leaderboard_settings())
    except Exception:
        crash = traceback.format_exc()
        print(crash, file=sys.stderr)
    finally:
        if watchdog is not None:
            watchdog.finish()
        if ctx is not None:
            ctx.close()
        if sandbox is not None:
            # Nothing the submission started may outlive grading and touch the results,
            # and the space it took is freed before the results are written.
            kill_user_processes(sandbox.identity)
            sandbox.cleanup()
        if results is not None:
            results.execution_time = time.monotonic() - started
            write_results(results, results_path)
        else:
            write_results(
                fallback_results(
                    "The autograder failed before it could grade your submission. "
                    "This is not your fault; please tell the course staff.\n\n" + crash[-3000:],
                    max_score=total,
                ),
                results_path,
            )
        if sandbox is not None:
            for warning in sandbox.warnings:
                print(f"warning: {warning}", file=sys.stderr)
    return results
