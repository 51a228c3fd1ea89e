"""Grading one submission: copy it into a sandbox, run the checks, write results.json.

``grade()`` is the whole pipeline, as the steps of a :class:`Grading`. Whatever happens
inside (a missing file, a hostile submission, a bug in the grader itself) the workers are
stopped first and a valid results file is written last, in a ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grader.core.feedback import markdown_results
from grader.core.paths import ASSIGNMENT, PROJECT_ROOT, SOLUTION, TEST_CASES
from grader.core.points import part_total
from grader.core.registry import PARTS, imports_ahead
from grader.core.results import (
    GradingResults,
    fallback_results,
    reserve_results,
    write_results,
)
from grader.core.score import part_scores, score_of
from grader.core.thresholds import (
    grading_budget_s,
    leaderboard_entries,
    leaderboard_settings,
    profile_provisional,
    resolve_device,
)
from grader.grading.suite import (
    Selection,
    build_suite,
    check_classes,
    parts_run,
    run_suite,
    yardsticks_ahead,
)
from grader.grading.watchdog import Watchdog
from grader.runtime.context import GradingContext
from grader.runtime.launch import STARTS
from grader.sandbox.ceiling import ceiling
from grader.sandbox.confine import ipc_isolation
from grader.sandbox.cpu_share import recorded_mode
from grader.sandbox.identity import RUN_RECORD_ENV
from grader.sandbox.layout import PartLayout, lay_out
from grader.sandbox.sandbox import (
    Limits,
    Sandbox,
    WorkerIdentity,
    kill_user_processes,
    network_isolation,
    protect_hidden,
)
from grader.sandbox.submission import CopyReport, copy_submission
from grader.sandbox.view import NONE, WorkerView, worker_view

__all__ = ["build_suite", "check_classes", "grade", "run_suite", "summary"]

UNFINISHED = (
    "The autograder did not finish grading your submission. This is not your fault; please "
    "tell the course staff."
)
CRASHED = (
    "The autograder failed before it could grade your submission. This is not your fault; "
    "please tell the course staff.\n\n"
)


def summary(results: GradingResults, notes: list[str]) -> str:
    """The top-of-page text a student sees on Gradescope (the bonus apart, as every view
    shows it: :mod:`grader.core.score`)."""
    lines = []
    for part, score in part_scores(results.tests).items():
        title = PARTS[part].title if part in PARTS else part
        lines.append(f"{part} ({title}): {score.text()}")
    lines.append(f"Total: {score_of(results.tests).text()}")
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def layout_notes(layouts: dict[str, PartLayout]) -> list[str]:
    """The page's lines on the files: those missing (what to upload, once per part), those
    the kit supplied and those found flat."""
    notes = [layout.missing_message(PARTS[p]) for p, layout in layouts.items() if layout.missing]
    supplied = sorted({rel for layout in layouts.values() for rel in layout.supplied})
    if supplied:
        notes.append(
            "Supplied from the assignment (not in your submission, and not yours to edit): "
            + ", ".join(supplied)
            + "."
        )
    moved = [m for layout in layouts.values() for m in layout.moved]
    if moved:
        notes.append("Uploaded without their folder, graded in it: " + "; ".join(moved) + ".")
    converted = [c for layout in layouts.values() for c in layout.converted]
    if converted:
        notes.append("Graded from your notebook: " + "; ".join(converted) + ".")
    return notes


def record_identity(sandbox: Sandbox) -> None:
    """Write the worker's uid and run gid where a supervising batch asked for them."""
    target = os.environ.get(RUN_RECORD_ENV)
    if target and sandbox.identity.dropped:
        Path(target).write_text(
            json.dumps({"uid": sandbox.identity.uid, "gid": sandbox.identity.gid})
        )


@dataclass
class Grading:
    """One grading run's state, step by step: each step reads what the earlier ones left."""

    submission: Path
    results_path: Path
    parts: list[str]
    limits: Limits
    cases_root: Path
    started: float = field(default_factory=time.monotonic)
    starts_before: Counter[str] = field(default_factory=lambda: Counter(STARTS))
    sandbox: Sandbox | None = None
    ctx: GradingContext | None = None
    watchdog: Watchdog | None = None
    copied: CopyReport | None = None
    layouts: dict[str, PartLayout] = field(default_factory=dict)
    results: GradingResults | None = None
    file_view: WorkerView | None = None  # the worker's view of the files
    crash: str = ""
    #: Print the sandbox's security warnings: where they matter (a TA's or Gradescope's
    #: grading), not in a student's self-check, who can do nothing about them (they stay
    #: in results.json).
    warn: bool = True

    @property
    def total(self) -> float:
        return sum(part_total(p) for p in self.parts if p in PARTS)

    def reserve(self) -> None:
        """A placeholder results file first: a grader killed from outside still leaves one."""
        with contextlib.suppress(OSError):
            reserve_results(self.results_path, UNFINISHED, max_score=self.total)

    def open_sandbox(self, identity: WorkerIdentity | None, hide: tuple[Path, ...]) -> None:
        """The sandbox and its worker account; the secrets closed to that account."""
        self.sandbox = sandbox = Sandbox.create(identity)
        record_identity(sandbox)
        self.watchdog = Watchdog(
            self.limits.grading_timeout_s, self.stop_workers, self.results_path, self.total
        )
        self.watchdog.start()
        protect_hidden(Path(self.cases_root) / "hidden", sandbox.identity)
        protect_hidden(SOLUTION, sandbox.identity)  # absent from the autograder zip
        self.file_view = worker_view(sandbox.identity.dropped)  # results: "file_view"
        isolation = network_isolation()
        if self.limits.isolate_network and isolation:
            kept = "UDP alone, Landlock closes TCP" if self.file_view.closes_tcp else "the network"
            sandbox.warnings.append(f"the worker keeps {kept}: {isolation}")
        # The grader's own files (a checkout's .git holds the solution) and whatever the
        # caller names (a batch's export) are covered in the worker's view.
        sandbox.hidden = [PROJECT_ROOT, *(Path(h) for h in hide)]
        if self.file_view.warning:
            sandbox.warnings.append(self.file_view.warning)
        if sandbox.identity.dropped and ipc_isolation():
            shared = "the worker shares System V IPC while it runs (removed after)"
            sandbox.warnings.append(f"{shared}: {ipc_isolation()}")

    def stop_workers(self) -> None:
        """The deadline passed: nothing more of the submission runs."""
        assert self.sandbox is not None
        self.sandbox.expired.set()
        if self.ctx is not None:
            self.ctx.kill_workers()
        kill_user_processes(self.sandbox.identity)

    def hand_over(self, device: str) -> None:
        """The submission copied into the sandbox, given to the worker account, and the
        context the checks reach it through, on ``device`` ("cpu" or "cuda", resolved)."""
        assert self.sandbox is not None
        self.copied = copy_submission(self.submission, self.sandbox.submission_dir)
        # The upload laid over the assignment's given files, before the worker owns it.
        self.layouts = lay_out(
            self.sandbox.submission_dir, self.parts, ASSIGNMENT, self.sandbox.identity
        )
        self.sandbox.hand_over()
        self.ctx = GradingContext(
            sandbox=self.sandbox,
            limits=self.limits,
            device=device,
            bases={p: layout.base for p, layout in self.layouts.items()},
            missing={p: layout.missing_message(PARTS[p]) for p, layout in self.layouts.items()},
            cases_root=self.cases_root,
            threads=worker_threads(),
        )

    def run_checks(self, selection: Selection) -> None:
        assert self.ctx is not None
        suite = build_suite(
            self.ctx,
            self.parts,
            selection.public_only,
            selection.tags,
            selection.skip_tags,
            selection.numbers,
        )
        self.ctx.ahead = imports_ahead(parts_run(suite, self.ctx.bases))
        self.ctx.before_first_worker = yardsticks_ahead(suite)
        # A check that would take the grader past its memory fails alone (sandbox/ceiling.py).
        # Not on a GPU: its seeded weights travel through the grader (1.6 GB for Part 2's),
        # and such a machine's memory is not a 768 MB container's.
        headroom = self.limits.grader_headroom_bytes if self.ctx.device == "cpu" else None
        with ceiling(headroom):
            self.results = run_suite(suite)

    def describe(self) -> None:
        """The page's summary, the run's facts for TAs, and the leaderboard."""
        ctx, sandbox, results = self.ctx, self.sandbox, self.results
        assert ctx is not None and sandbox is not None and results is not None
        benchmarks = {num: rec.summary() for num, rec in sorted(ctx.benchmarks.items())}
        notes = layout_notes(self.layouts)
        notes += self.copied.notes() if self.copied else []
        if benchmarks:
            unsure = profile_provisional(ctx.device)
            notes.append(
                f"Benchmark checks ({', '.join(benchmarks)}) were timed on {ctx.device} and "
                f"judged with the {ctx.device} threshold profile"
                + (" (provisional: not yet calibrated on this device)." if unsure else ".")
            )
        if sandbox.expired.is_set():
            notes.append(
                f"The grading ran past its {self.limits.grading_timeout_s:.0f} s budget: the "
                "check running then was stopped and the ones after it were not run."
            )
        named = ctx.scratch.get("causes", {})
        details = ctx.scratch.get("details", {})
        for test in results.tests:  # the named causes' ids, beside the failed checks' text
            if test.status == "failed" and named.get(test.number):
                test.extra_data["causes"] = named[test.number]
            test.extra_data.update(details.get(test.number, {}))
        results.output = summary(results, notes)
        results.extra_data = {
            "device": ctx.device,
            "benchmark_profile": ctx.device,
            "benchmark_profile_provisional": profile_provisional(ctx.device),
            "benchmarks": benchmarks,
            "parts": self.parts,
            "worker_user": sandbox.identity.name,
            "cpu_accounting": ctx.cpu_accounting(),
            "cpu_isolation": recorded_mode(),  # a class regrade's share per grading
            "files": {
                p: {
                    "supplied": lo.supplied,
                    "moved": lo.moved,
                    "missing": lo.missing,
                    "converted": lo.converted,
                }
                for p, lo in self.layouts.items()
            },
            "sandbox_warnings": sandbox.warnings,
            # The worker's view of the files: mount-namespace, landlock or none.
            "file_view": self.file_view.kind if self.file_view else NONE,
            "notes": notes,  # the page's lines under the scores, for the terminal's views
            # How its workers started (a class regrade forks them from a shared server).
            "worker_starts": dict(STARTS - self.starts_before),
        }
        results.leaderboard = leaderboard_entries(benchmarks, leaderboard_settings())

    def close(self) -> None:
        """Stop everything the submission started, free its space, then write the results
        (or a fallback that says the grader failed). The deadline holds until the file is
        written: the page is built from what the submission returned."""
        try:
            if self.ctx is not None:
                self.ctx.close()
            if self.sandbox is not None:
                # Nothing the submission started may outlive grading and touch the results,
                # and the space it took is freed before the results are written.
                kill_user_processes(self.sandbox.identity)
                self.sandbox.cleanup()
            if self.results is not None:
                self.results.execution_time = time.monotonic() - self.started
                # The file speaks Gradescope's Markdown; the returned results keep plain
                # text for the terminal.
                write_results(markdown_results(self.results), self.results_path)
            else:
                fallback = fallback_results(CRASHED + self.crash[-3000:], max_score=self.total)
                write_results(fallback, self.results_path)
        finally:
            if self.watchdog is not None:
                self.watchdog.finish()
        if self.sandbox is not None and self.warn:
            for warning in self.sandbox.warnings:
                print(f"warning: {warning}", file=sys.stderr)


def worker_threads() -> int:
    """The threads a worker's libraries may use: one unless ``KVGRADER_THREADS`` says
    more. On a shared or fractional CPU (Gradescope gives 1/2 a core) more threads than
    cores makes torch's OpenMP workers spin against each other, turning milliseconds into
    seconds."""
    return int(os.environ.get("KVGRADER_THREADS", "1"))


def limits_for(device: str) -> Limits:
    """The sandbox's limits for a grading on ``device``: the defaults (Gradescope's), with
    the whole grading's wall clock from the device's profile where it sets one."""
    budget = grading_budget_s(device)
    if budget is None:
        return Limits()
    # The CPU-time backstop stays above the wall clock: a GPU worker's host thread spins
    # while it waits for the device.
    return Limits(grading_timeout_s=budget, cpu_seconds=max(Limits.cpu_seconds, int(budget)))


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
    device = resolve_device(device)
    run = Grading(
        Path(submission),
        results_path,
        parts or list(PARTS),
        limits or limits_for(device),
        cases_root,
    )
    run.warn = not public_only  # a public-only run is a student's self-check
    try:
        run.reserve()
        run.open_sandbox(identity, hide)
        run.hand_over(device)
        run.run_checks(Selection(public_only, tags, skip_tags, numbers))
        run.describe()
    except Exception:
        run.crash = traceback.format_exc()
        print(run.crash, file=sys.stderr)
    finally:
        run.close()
    return run.results
