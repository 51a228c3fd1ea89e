"""What every check shares: the decorator, the base class, value checking, diagnosis."""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import reprlib
import sys
import unittest
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

from gradescope_utils.autograder_utils.decorators import (
    number as gs_number,
)
from gradescope_utils.autograder_utils.decorators import (
    partial_credit,
    tags,
    visibility,
    weight,
)

from grader.core.feedback import CUT_SHORT, GPU_HELD, NOT_GRADED, confirmed, memory_label
from grader.core.feedback_items import ITEMS, PRINTED, Case, Cause, Feedback, LogitCase
from grader.core.points import POINTS, part_of, points
from grader.core.registry import PARTS, CheckDeclaration, fill
from grader.judging import yardstick
from grader.runtime.context import GradingContext
from grader.runtime.outcomes import SubmissionError
from grader.runtime.starvation import STARVED, taken
from grader.runtime.timing import (
    FULL_TIMING,
    BenchmarkRecord,
    Criterion,
    Measurement,
    Ratio,
    Sample,
    Timing,
    measure,
)


def check(num: str, *, vis: str = "visible") -> Callable[[Callable], Callable]:
    """Mark a test method as graded check ``num`` as its part declares it
    (``grader/parts/<tag>/part.toml``): its title, points, part tag and flags.

    ``hidden`` checks use cases only the autograder has; they carry the tag "hidden", so a
    student's self-check can leave them out. A ``bonus`` check has a maximum of 0 and
    awards its points (``points.BONUS``) through ``set_score``: Gradescope's extra credit.
    A ``timed`` check compares the submission's times with the reference's, timed in the
    same grading (:meth:`GradedTestCase.yardstick`). The title's ``{...}`` fields are
    filled from the part's ``cases`` module, so a title that states a size changes with it.
    """
    declared = PARTS[part_of(num)].check(num)
    flags = {"benchmark": declared.benchmark, "hidden": declared.hidden,
             "bonus": bool(declared.bonus)}  # fmt: skip
    partial = declared.partial or bool(declared.bonus)

    def decorate(fn: Callable) -> Callable:
        w = 0.0 if declared.bonus else points(num)
        fn = _graded_part_only(fn, num)
        if partial:
            fn = partial_credit(w)(fn)
        fn = weight(w)(fn)
        fn = gs_number(num)(fn)
        fn = visibility(vis)(fn)
        fn.__yardstick__ = declared.timed
        fn = tags(part_of(num), *(tag for tag, on in flags.items() if on))(fn)
        fn.__doc__ = f"{num} {declared_title(declared)}"
        return fn

    return decorate


def declared_title(declared: CheckDeclaration) -> str:
    """A check's declared title with its fields filled from its part's ``cases`` module
    (imported by the part's checks before they are declared)."""
    name = f"grader.parts.{part_of(declared.number)}.cases"
    cases = sys.modules.get(name)
    if cases is None and "{cases." in declared.title:
        raise RuntimeError(
            f"check {declared.number}'s title names {name}, which is not imported yet: "
            "declare a part's checks in a module that imports its cases first"
        )
    return fill(declared.title, cases=cases)


def _graded_part_only(fn: Callable, num: str) -> Callable:
    """``fn`` (check ``num``) fails at once when its part's files are not in the
    submission: the part's first check says what to upload, every other one points to it
    (a page of 11 copies of the same sentence hides the one thing to do)."""

    @functools.wraps(fn)
    def guarded(self: GradedTestCase, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.ctx.bases.get(self.part) is None:
                first = next(iter(POINTS[self.part]))
                self.note_detail(NOT_GRADED, "missing" if num == first else "see_first")
                if num == first:
                    self.fail(self.ctx.missing_message(self.part))
                self.fail(f"Not graded: {self.part}'s files are not in your submission "
                          f"({first} says which to upload).")  # fmt: skip
            return fn(self, *args, **kwargs)
        except self.failureException as exc:
            # The message is written again from the items: the causes named apart too.
            self.feedback.end(str(exc))
            raise self.failureException(self.feedback.text()) from None

    return guarded


class ValueProblem(Exception):
    """A returned value has the wrong type or is not finite."""


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 200
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 8


def shown(value: Any) -> str:
    """A value from the worker as feedback quotes it: its ``repr``, cut to a couple of
    hundred characters (``...`` where cut). A reply may carry megabytes of text the
    submission chose, and every character of a message costs the grader work and the
    page room."""
    return _SHOWN.repr(value)


def as_number(enc: Any, want: str, what: str, notes: list[str] | None = None) -> float | int:
    """Validate a tagged value from the worker as ``want`` ("int" or "float").

    With ``notes``, a float with a whole-number value where an int is wanted (4096.0)
    is that int: its value is right, so it costs nothing, and a note for the feedback is
    appended to ``notes``. Without it (the default), such a float is a type error.
    """
    if not isinstance(enc, dict) or "kind" not in enc:
        raise ValueProblem(f"{what} returned something the grader cannot read.")
    kind = enc["kind"]
    if kind == "tensor-scalar":
        raise ValueProblem(
            f"{what} returned a torch tensor; return a plain Python number (use .item())."
        )
    value = enc.get("value")
    if want == "int":
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "float" and notes is not None and whole_float(value):
            notes.append(
                f"{what} returned a whole number as a float where an int is asked for; it "
                "was accepted as that int (return an int: // instead of /, or int(...))."
            )
            return int(value)
        if kind == "float":
            raise ValueProblem(
                f"{what} must return an int, but returned the float {shown(value)}; "
                "use integer arithmetic (// instead of /) or int(...)."
            )
    else:
        if kind == "int" and isinstance(value, int):
            return float(value)
        if kind == "float":
            if isinstance(value, str) or not math.isfinite(value):
                raise ValueProblem(f"{what} returned {str(value)[:200]}, not a finite number.")
            return float(value)
    if kind == "other":
        got = f"an object of type {str(enc.get('type'))[:200]}"
    elif kind == "none":
        got = "None (is a `return` missing?)"
    else:
        got = f"a {str(kind)[:200]} ({shown(value)})"
    raise ValueProblem(f"{what} must return a{'n' if want == 'int' else ''} {want}, got {got}.")


def whole_float(value: Any) -> bool:
    """A finite float with no fractional part (a reply field: anything may arrive)."""
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


def finite_number(value: Any) -> bool:
    """A real int or float, not a bool, a string, NaN or an infinity (reply fields are
    data from the worker: anything may arrive)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def values_match(got: float, expected: float, rel_tol: float) -> bool:
    """Exact for ints, relative tolerance for floats."""
    if isinstance(got, int) and isinstance(expected, int):
        return got == expected
    return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=1e-12)


def diagnose(
    got: Any, mistakes: dict[str, Any], diagnoses: dict[str, str], rel_tol: float
) -> list[Cause]:
    """The known mistakes whose output equals the student's value."""
    names = [
        name
        for name, value in mistakes.items()
        if same_value(got, value, rel_tol) and name in diagnoses
    ]
    return likely_cause(names, diagnoses, "the returned value equals this mistake's")


def likely_cause(names: list[str], diagnoses: dict[str, str], evidence: str = "") -> list[Cause]:
    """The named mistakes that the catalogue describes, each once, as causes ("your code
    ..."), with the evidence that named them."""
    known = [n for n in dict.fromkeys(names) if n in diagnoses]  # each cause once
    return [Cause(n, f"your code {diagnoses[n]}", evidence) for n in known]


def cause_sentence(causes: list[Cause]) -> str:
    """ "Likely cause: ..." for ``causes`` in a plain message ("" if none): for a message
    that is not a check's own (an error remembered for the checks after it)."""
    if not causes:
        return ""
    return f"Likely cause: {'; or '.join(c.text for c in causes)}."


def same_value(got: Any, value: Any, rel_tol: float) -> bool:
    """Numbers (or dicts of numbers, key for key) equal under :func:`values_match`."""
    if isinstance(got, dict) and isinstance(value, dict):
        return got.keys() == value.keys() and all(
            same_value(got[k], value[k], rel_tol) for k in got
        )
    if isinstance(got, (int, float)) and isinstance(value, (int, float)):
        return values_match(got, value, rel_tol)
    return False


# A workload the reference is timed on: (run(variant, round), variants, bench settings).
Workload = tuple[Callable[[str, int], Sample], Sequence[str], dict[str, Any]]


#: One failure of a case: a failing case, or a plain line (a failure not of one case).
Failure = Case | LogitCase | str


@dataclass
class Outcome:
    """Cases passed out of those run, with the failures."""

    passed: int = 0
    total: int = 0
    failures: list[Failure] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def listing(self, most: int = 3) -> Feedback:
        """The first ``most`` failures, and how many more there are: a cut list says so."""
        fb = Feedback(more=max(0, len(self.failures) - most))
        for failure in self.failures[:most]:
            fb.add(failure)
        return fb


class GradedTestCase(unittest.TestCase):
    """Base of every check class. ``ctx`` is bound by the runner, per grading run."""

    part: ClassVar[str]
    ctx: ClassVar[GradingContext]
    longMessage = False
    maxDiff = None
    #: Why this check's yardstick is missing ("" when measured, or not asked for).
    yardstick_fault = ""

    def shortDescription(self) -> str | None:
        """The check's whole title, Gradescope's test name: the first paragraph of its
        docstring on one line (unittest keeps only the first line, which cuts a title
        that wraps mid-sentence)."""
        doc = self._testMethodDoc
        return " ".join(doc.strip().split("\n\n")[0].split()) if doc else None

    def setUp(self) -> None:
        # gradescope-utils keeps partial scores on the function object: clear
        # any left from an earlier run in the same process.
        fn = getattr(type(self), self._testMethodName)
        if hasattr(fn, "__score__"):
            fn.__score__ = None
        #: What this check says, as items (:mod:`grader.core.feedback_items`).
        self.feedback = Feedback()
        #: Plain JSON data about this check for reports (see :meth:`note_detail`).
        self.details: dict[str, Any] = {}
        #: Lines this check printed for the log only (a benchmark's measurements, which
        #: the page shows as tables): not lines of its feedback.
        self.unsaid: set[str] = set()

    def tearDown(self) -> None:
        """Hand this check's items, the ids of the causes it named and its details to the
        grading (``ctx.scratch``), which keeps them in the check's ``extra_data``: the
        lines the check printed (its stdout, which the runner captures) lead its items;
        and the requests a busy machine starved (:mod:`grader.runtime.starvation`)."""
        if starved := taken():
            self.note_detail(STARVED, starved)
        fb = self.feedback
        printed = sys.stdout.getvalue() if isinstance(sys.stdout, io.StringIO) else ""
        skip = {fb.count, *self.unsaid}
        fb.lead[:0] = [x for x in printed.splitlines() if x.strip() and x not in skip]
        number = self.check_number()
        if fb.cause_ids():
            self.ctx.scratch.setdefault("causes", {})[number] = fb.cause_ids()
        # Kept even when empty: a check that says nothing shows nothing but its verdict.
        details = {**self.details, ITEMS: fb.to_json()}
        self.ctx.scratch.setdefault("details", {})[number] = details

    def note_detail(self, key: str, value: Any) -> None:
        """Keep plain JSON data about this check for reports (the self-check's pictures):
        the runner stores it in its results' ``extra_data``. The first value noted under a
        key stands (the first failing case)."""
        self.details.setdefault(key, value)

    def name(self, causes: list[Cause]) -> None:
        """Name ``causes`` in this check's feedback (each once); their ids are kept in
        results.json (``extra_data["causes"]``) for reports to count."""
        self.feedback.name(causes)

    def once_per_grading(self, key: str, find: Callable[[], str]) -> str:
        """``find()``'s verdict, computed once per grading for every check that asks (a
        probe two checks share); the causes it named are named again on each later check
        that reports it, so the page of every check that lost points to it says why. A
        verdict that ended in a failure (``failureException``) is kept as its message and
        raised again where it was found."""
        memo = self.ctx.scratch.setdefault(f"{self.part}.{key}", [])
        if memo:
            verdict, causes = memo[0]
            self.name(causes)
            return str(verdict)
        before = len(self.feedback.causes)
        try:
            verdict = find()
        except self.failureException as exc:
            memo.append((str(exc), list(self.feedback.causes[before:])))
            raise
        memo.append((verdict, list(self.feedback.causes[before:])))
        return verdict

    def say_count(self, passed: int, total: int, what: str = "cases") -> None:
        """ "18 of 32 cases correct.": the verdict line carries it."""
        self.feedback.count = f"{passed} of {total} {what} correct."
        print(self.feedback.count)

    def fail_with(self, items: Feedback) -> NoReturn:
        """Fail with ``items`` (failing cases, lines, causes) added to this check's
        feedback; the message is their plain text."""
        fb = self.feedback
        (fb.notes if fb.cases else fb.lead).extend(items.lead)
        fb.cases += items.cases
        fb.notes += items.notes
        fb.more += items.more
        fb.name(items.causes)
        fb.printed = fb.printed or items.printed
        fb.ended = True
        self.fail(fb.text())

    def request(self, header: dict[str, Any], *, what: str, **kwargs: Any) -> Any:
        """Send a request to this part's worker; a submission problem fails the check."""
        try:
            return self.ctx.worker(self.part).request(header, what=what, **kwargs)
        except SubmissionError as exc:
            self.fail(with_output(exc.message, exc.output))

    def cases(self, num: str) -> list[dict[str, Any]]:
        """The cases of check ``num`` (public and hidden)."""
        return [c for c in self.ctx.cases(self.part)["cases"] if c["check"] == num]

    def once_per_worker(self, key: str, build: Callable[[], None]) -> None:
        """Run ``build`` (state it sets up inside the worker, such as a model) unless this
        worker process already ran it; a restarted worker runs it again."""
        worker = self.ctx.worker(self.part)
        done = self.ctx.built(self.part)
        if worker.running and done.get(key) == worker.starts:
            return
        build()
        done[key] = worker.starts

    def build_once(
        self, key: str, build: Callable[[], None], not_run: str, *, full: bool = False
    ) -> None:
        """:meth:`once_per_worker`, remembering a failure of the submission: ``full`` (the
        check that explains it) gets it whole, every other caller ``not_run`` in one line.
        A ``not_run`` with a ``{shown}`` field names the check that showed the failure
        whole: the first ``full`` caller or, where none came first, the first caller."""
        self.ctx.worker(self.part)  # a missing file is reported as such, not remembered
        failed = self.ctx.scratch.setdefault(f"{self.part}.failed", {})
        if key not in failed:
            try:
                self.once_per_worker(key, build)
            except SubmissionError as exc:
                failed[key] = [exc, None]
        if key in failed:
            exc, shown = failed[key]
            if full or (shown is None and "{shown}" in not_run):
                failed[key][1] = shown or self.check_number()
                raise exc
            raise SubmissionError(not_run.format(shown=shown), "load")

    def check_number(self) -> str:
        """The number of the check running now ("" outside a check)."""
        method = getattr(self, getattr(self, "_testMethodName", ""), None)
        return str(getattr(method, "__number__", ""))

    def measure_benchmark(
        self,
        run: Callable[[str, int], Sample],
        variants: Sequence[str],
        judge: Callable[[dict[str, Timing]], list[Criterion]],
        bench: dict[str, Any],
        lost: Callable[[], str] | None = None,
    ) -> Measurement:
        """Time ``variants`` with the warm-up, repeats and confirmation rounds of
        ``bench`` (one part of the thresholds profile) and judge them. ``lost`` says why
        the timed runs so far already lose the check ("" while they do not): the rounds
        stop there, unless ``KVGRADER_FULL_TIMING=1`` asks for every round (calibration,
        which needs the cache-free designs' ratios)."""
        full = os.environ.get(FULL_TIMING) == "1"
        return measure(
            run,
            list(variants),
            warmup=bench["warmup"],
            repeats=bench["repeats"],
            judge=judge,
            confirm_repeats=bench["confirm_repeats"],
            decided_elsewhere=None if lost is None or full else lambda: bool(lost()),
        )

    def yardstick_workloads(self) -> dict[str, Workload]:
        """The part's workloads the reference is timed on (none by default): name ->
        (run, variants, bench settings), ``run`` being the same function that times the
        submission."""
        return {}

    def yardstick(self, name: str) -> dict[str, Timing]:
        """The reference solution's timings of workload ``name`` (its cached runs): the
        yardstick of :meth:`versus_reference`. All the part's workloads are timed together
        the first time one is asked for, in one trusted worker of the reference's own on the
        grading device, under the same limits, with each workload's warm-up, until its
        runs are steady (at most its repeats: :func:`until_steady`).
        Empty when the profile sets no ``max_vs_reference`` or the reference is not here,
        and when its runs failed (:mod:`grader.judging.yardstick`): then the check's page
        says so, once, and its record is flagged for the TA.
        The reference takes the prompts from the start of each pool, and gives them back:
        the submission's runs still get ones it has never seen."""
        yardsticks = self._yardsticks()
        fault = self.ctx.scratch.get(yardstick.fault_key(self.part), "")
        if fault and not self.yardstick_fault:
            self.yardstick_fault = fault
            print(yardstick.NOT_MEASURED)
        return yardsticks.get(name, {})

    def time_yardstick_ahead(self) -> None:
        """Time the reference's workloads now, before the submission's worker first starts
        (the runner asks it of a part's first check that needs them): its worker then runs
        the whole part without a reference session in between. A failure is kept (see
        :meth:`yardstick`): the checks that ask for it are judged without it."""
        with contextlib.suppress(Exception):
            self._yardsticks()

    def _yardsticks(self) -> dict[str, dict[str, Timing]]:
        """Every workload's yardstick, timed once per grading (a failure too)."""
        key = f"{self.part}.yardstick"
        if key not in self.ctx.scratch:
            self.ctx.scratch[key] = self._time_reference()
        return self.ctx.scratch[key]

    def _time_reference(self) -> dict[str, dict[str, Timing]]:
        workloads = {
            name: w for name, w in self.yardstick_workloads().items() if "max_vs_reference" in w[2]
        }
        if not workloads or not self.ctx.reference_available(self.part):
            return {}
        timed, why = yardstick.time_reference(self.ctx, self.part, workloads)
        if why:
            self.ctx.scratch[yardstick.fault_key(self.part)] = why[:400]
            self.ctx.sandbox.warnings.append(yardstick.staff_warning(self.part, why[:400]))
        return timed

    def versus_reference(
        self,
        timings: dict[str, Timing],
        reference: dict[str, Timing],
        bench: dict[str, Any],
        clock: str,
    ) -> list[Criterion]:
        """For every variant the reference was timed on: the submission's time over the
        reference's, at most ``max_vs_reference``. A "cache" that does part of the work
        again stays slower than a cache by that work, however its own two paths compare."""
        return [
            Criterion(
                f"{self.part}.max_vs_reference",
                f"{variant}, over the reference's ({clock} time)",
                Ratio.against(timings[variant], yardstick, clock),
                bench["max_vs_reference"],
                False,
            )
            for variant, yardstick in reference.items()
        ]

    def report_benchmark(self, record: BenchmarkRecord, headline: str, advice: str) -> None:
        """Keep ``record`` for the results (calibration, leaderboard), print what was
        measured under ``headline``, and fail with ``advice`` if a threshold was missed."""
        self.ctx.benchmarks[record.check] = record
        record.grader_fault = self.yardstick_fault
        lines = [f"{headline} ({record.profile} profile)"]
        sources = [t.peak_source for t in record.timings.values()]
        memory = memory_label(sources, record.profile)
        for name, t in record.timings.items():
            line = (
                f"  {name}: median {t.median * 1000:.1f} ms of {len(t.samples)} runs "
                f"(CPU time {t.cpu_median * 1000:.1f} ms), spread {t.spread:.0%}"
            )
            if t.peak_bytes is not None:
                line += f", {memory} {t.peak_bytes / 2**20:.1f} MB"
            if t.gpu_held_bytes is not None:
                line += f", {GPU_HELD} {t.gpu_held_bytes / 2**20:.1f} MB"
            lines.append(line)
        lines += [f"  {c.describe()}" for c in record.criteria]
        if record.extra_rounds:
            lines.append(f"  {confirmed(record.extra_rounds)}")
        if record.cut_short:
            lines.append(f"  {CUT_SHORT}")
        print("\n".join(lines))
        self.unsaid.update(lines)  # the page draws them as tables
        if not record.passed:
            missed = "; ".join(c.describe() for c in record.failures())
            self.fail(f"{missed}.\n{advice}")

    def require_hidden(self) -> None:
        """Skip-as-failure when the hidden cases are absent (the student's local copy)."""
        if not self.ctx.cases(self.part)["hidden_available"]:
            self.fail("Hidden cases are only available on Gradescope; this check runs there.")


def with_output(message: str, output: str) -> str:
    """Append what the submission printed, if anything, to a failure message."""
    output = output.strip()
    if not output:
        return message
    return f"{message}{PRINTED}{output}"
