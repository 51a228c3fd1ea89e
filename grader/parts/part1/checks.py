"""Part 1 checks: the KV-cache / batch-size / arithmetic-intensity calculator.

Every value check runs the student's function in the worker on generated
cases (the handout's spec in public checks, seeded random specs in hidden
ones) and compares with the reference's values stored in ``test_cases/``.
When a wrong value equals what a known mistake, or a combination of known
mistakes, produces, the feedback names them (:mod:`grader.parts.part1.causes`);
when it follows from another function's wrong value, it points back to that
function's check (:mod:`grader.parts.part1.knock_on`); when it is the write-up's
answer for another input, it says the answer looks written in. A whole number
returned as a float where an int is asked for is accepted, with a note.

The public cases hold write-up answers and are sealed (:mod:`grader.parts.part1.seal`).
Where the hidden file is present (Gradescope, a TA's checkout) its ``answers`` give
their plain values and they are compared as every other case; the student's
self-check compares through the seals, with the same messages.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from grader.core.feedback_items import Case, Cause
from grader.core.points import points
from grader.judging.base import (
    Failure,
    GradedTestCase,
    Outcome,
    ValueProblem,
    as_number,
    check,
    shown,
    whole_float,
    with_output,
)
from grader.judging.images import problem_with_png
from grader.parts.part1.causes import combination, cover, hard_coded_cause, name_causes
from grader.parts.part1.knock_on import (
    Call,
    derivation,
    entry_derivation,
    follows_from,
    knock_on_sentence,
    number,
    pointer,
)
from grader.parts.part1.probe import isolate
from grader.parts.part1.script import NOT_ASKED, grade_case, script_run
from grader.parts.part1.seal import Verdict
from grader.runtime.outcomes import SubmissionError

FATAL = {"missing", "import", "timeout", "crash"}
#: Seconds a plot may take: the first imports matplotlib in the worker, which builds its
#: font cache in the worker's fresh configuration folder (seen past the 20 s of a request
#: twice on this kit's busy 2-core VM, the reference's plots included).
PLOT_TIMEOUT_S = 60.0


def fmt(value: Any) -> str:
    """Numbers as a student reads them: ints with separators, floats to 6 digits; any
    other value the worker sent, cut short."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        items = [f"{str(k)[:100]}: {fmt(v)}" for k, v in list(value.items())[:20]]
        return "{" + ", ".join(items + ["..."] * (len(value) > 20)) + "}"
    return shown(value)  # a string, a list: cut to what the page can show


def compared(kind: str, rel_tol: float) -> str:
    """How a value of ``kind`` ("int" or "float") is compared, in words."""
    return "exactly" if kind == "int" else f"within a relative tolerance of {rel_tol:g}"


def wrong_value(what: str, got: Any, verdict: Verdict) -> Case:
    """What was compared and what the student returned, never the expected value.

    Every public Part 1 value is an answer of the write-up (parameter counts, cache
    sizes, max batch sizes, intensities), and the hidden ones are Gradescope's: feedback
    says which value or which table entries are wrong and shows the student's own
    numbers only.
    """
    kinds, rel_tol = verdict.kinds(), verdict.rel_tol
    if isinstance(kinds, dict) and isinstance(got, dict):
        wrong = verdict.wrong_entries(got)
        yours = ", ".join(
            f"{k} = {fmt(got[k])} (compared {compared(kinds[k], rel_tol)})" for k in wrong
        )
        right = len(kinds) - len(wrong)
        return Case(what, f"wrong entries: {yours}; the other {right} entries are right.")
    return Case(what, fmt(got), f"compared {compared(str(kinds), rel_tol)}")


class Part1Checks(GradedTestCase):
    part = "part1"

    # ---------------------------------------------------------------- machinery

    def setUp(self) -> None:
        super().setUp()
        #: Notes on values accepted with a remark (a whole float for an int), printed once.
        self.notes: dict[str, str] = {}

    def evaluate(self, case: dict[str, Any]) -> tuple[bool, Failure, str]:
        """Run one case: (passed, its failure, kind of failure); its causes are named in
        the check's feedback."""
        what = f"{case['func']}({case['label']})"
        try:
            reply = self.ctx.worker(self.part).request(Call.of(case).header(), what=what)
        except SubmissionError as exc:
            printed = self.from_script(case, exc)
            if printed is not None:
                return printed
            return False, with_output(exc.message, exc.output), exc.kind
        verdict = Verdict(case, self.answer(case), self.rel_tol())
        notes: list[str] = []
        try:
            got = self.decode(reply.header["result"], case["want"], verdict.kinds(), what, notes)
        except ValueProblem as exc:
            return False, str(exc), "type"
        for note in notes:  # one per function (and table entry): the first case's
            self.notes.setdefault(case["func"] + note.replace(what, "", 1), note)
        if verdict.right(got):
            return True, "", ""
        explained = self.explain_table if isinstance(got, dict) else self.explain
        remarks, causes = explained(case, verdict, got)
        self.name(causes if isinstance(got, dict) else isolate(self, case, verdict, got, causes))
        remark = " ".join(r for r in remarks if r)
        return False, replace(wrong_value(what, got, verdict), remark=remark), "value"

    def explain(
        self, case: dict[str, Any], verdict: Verdict, got: Any
    ) -> tuple[list[str], list[Cause]]:
        """Why a wrong number may be wrong: the function's check it follows from (a
        remark), then a write-up answer written in or the known mistakes (single or
        combined) it equals (causes)."""
        uses = derivation(Call.of(case))
        knock_on = self.follows(got, uses) if uses else []
        cause = self.hard_coded(case, got) or name_causes(verdict.mistakes(got), self.diagnoses())
        return [knock_on_sentence(knock_on)], cause

    def explain_table(
        self, case: dict[str, Any], verdict: Verdict, got: Any
    ) -> tuple[list[str], list[Cause]]:
        """Why a table's wrong entries may be wrong: per entry, the function's check it
        follows from; then the known mistakes whose whole table it is, or else those that
        give its wrong entries, entry by entry (one slip, such as GB for GiB, shows in
        some entries of a table that is otherwise right)."""
        wrong = verdict.wrong_entries(got)
        sources = case.get("entries_from", {})
        by_pointer: dict[str, tuple[list[Call], list[str]]] = {}
        for key in wrong:
            calls = self.follows(got[key], entry_derivation(sources[key])) if key in sources else []
            if calls:
                by_pointer.setdefault(pointer(calls), (calls, []))[1].append(key)
        sentences = [knock_on_sentence(calls, keys) for calls, keys in by_pointer.values()]
        whole = verdict.mistakes(got)
        if whole:
            return sentences, name_causes(whole, self.diagnoses())
        per_entry = {k: names for k in wrong if (names := verdict.entry_mistakes(got, k))}
        if per_entry:
            of = "" if len(per_entry) == len(wrong) else " and ".join(per_entry)
            return sentences, name_causes([combination(cover(per_entry))], self.diagnoses(), of)
        return sentences, []

    def follows(self, got: Any, uses: Any) -> list[Call]:
        """The calls whose wrong values ``got`` follows from (see
        :func:`grader.parts.part1.knock_on.follows_from`)."""
        return follows_from(got, uses, self.own, self.judge, self.rel_tol())

    def own(self, call: Call) -> int | float | None:
        """The student's value of ``call`` (None if it fails), asked once per grading."""
        values = self.ctx.scratch.setdefault(f"{self.part}.own", {})
        key = call.key()
        if key not in values:
            try:
                reply = self.ctx.worker(self.part).request(call.header(), what=call.func)
            except SubmissionError:
                values[key] = None
            else:
                values[key] = number(reply.header.get("result"))
        return values[key]

    def judge(self, call: Call, value: int | float) -> bool | None:
        """Whether ``value`` is right for ``call``, where a case of the same call judges it."""
        index = self.ctx.scratch.setdefault(f"{self.part}.by_call", {})
        if not index:
            for c in reversed(self.ctx.cases(self.part)["cases"]):
                index[Call.of(c).key()] = c  # the first case of a call wins
        case = index.get(call.key())
        if case is None:
            return None
        verdict = Verdict(case, self.answer(case), self.rel_tol())
        kind = verdict.kinds()
        value = int(value) if kind == "int" and whole_float(value) else value
        return verdict.right(float(value) if kind == "float" else value)

    def hard_coded(self, case: dict[str, Any], got: Any) -> list[Cause]:
        """The hard-coded cause, where ``got`` (not 0) is the write-up's answer for another
        input of the same function (none otherwise)."""
        if got == 0:
            return []
        key = Call.of(case).key()
        for other in self.ctx.cases(self.part)["cases"]:
            if "sealed" not in other or other["func"] != case["func"]:
                continue
            if Call.of(other).key() == key:
                continue
            if Verdict(other, self.answer(other), self.rel_tol()).right(got):
                return hard_coded_cause(other["label"])
        return []

    def rel_tol(self) -> float:
        return self.ctx.cases(self.part)["rel_tol"]

    def from_script(
        self, case: dict[str, Any], exc: SubmissionError
    ) -> tuple[bool, Failure, str] | None:
        """A file that defines none of the kit's functions is a course-style script: the
        case is judged from what it prints (:mod:`grader.parts.part1.script`). None for
        any other failure, which is reported as it is."""
        if exc.error.get("type") != "MissingName":
            return None
        run = script_run(self.ctx, self.part)
        if run is None:
            return None
        verdict = Verdict(case, self.answer(case), self.ctx.cases(self.part)["rel_tol"])
        return grade_case(run, case, verdict, self.diagnoses())

    def answer(self, case: dict[str, Any]) -> dict[str, Any] | None:
        """A case's plain expected value and mistakes: in the case itself, or for a sealed
        case in the hidden file's ``answers``; ``None`` where only its seals are at hand."""
        if "expected" in case:
            return case
        return self.ctx.cases(self.part).get("answers", {}).get(case["id"])

    def decode(
        self,
        enc: Any,
        want: str,
        kinds: str | dict[str, str],
        what: str,
        notes: list[str] | None = None,
    ) -> Any:
        """The worker's encoded reply as a number, or as a table with the expected keys;
        with ``notes``, a whole float where an int is wanted is that int, noted there."""
        if want != "table" or not isinstance(kinds, dict):
            return as_number(enc, want, what, notes)
        if not isinstance(enc, dict) or enc.get("kind") != "dict":
            raise ValueProblem(f"{what} must return a dict with the keys {list(kinds)}.")
        entries = enc["value"]
        missing = [k for k in kinds if k not in entries]
        if missing:
            raise ValueProblem(f"{what} is missing the keys {missing}.")
        return {
            key: as_number(entries[key], kind, f"{what}[{key!r}]", notes)
            for key, kind in kinds.items()
        }

    def diagnoses(self) -> dict[str, str]:
        return self.ctx.cases(self.part)["diagnoses"]

    def run_cases(self, num: str) -> Outcome:
        """Evaluate every case of check ``num``; stop early on failures that would repeat.
        The notes of whole floats accepted as ints are printed, once each."""
        outcome, not_asked = Outcome(), list[Failure]()
        self.notes.clear()
        for case in self.cases(num):
            outcome.total += 1
            ok, message, kind = self.evaluate(case)
            if ok:
                outcome.passed += 1
                continue
            if kind == NOT_ASKED:  # a script's: the course never asked for this input
                outcome.total -= 1
                not_asked.append(message)
                continue
            outcome.failures.append(message)
            if kind in FATAL:
                outcome.total = len(self.cases(num))
                break
        if not_asked and not outcome.total:  # nothing here a script can answer
            outcome.total, outcome.failures = len(not_asked), not_asked
        elif not_asked:
            print(
                f"Graded on the {outcome.total} input(s) the course asked about; "
                f"{len(not_asked)} more are graded once question1.py defines the function. "
                f"First: {not_asked[0]}"
            )
        for note in self.notes.values():
            print(f"Note: {note}")
        return outcome

    def all_or_nothing(self, num: str) -> None:
        outcome = self.run_cases(num)
        if not outcome.total:
            self.fail(f"No test cases for check {num}: run `python -m grader regen`.")
        if outcome.failures:
            self.fail_with(outcome.listing())

    def partial(self, num: str, set_score: Any) -> None:
        self.require_hidden()
        outcome = self.run_cases(num)
        set_score(round(points(num) * outcome.fraction, 4))
        self.say_count(outcome.passed, outcome.total, "hidden cases")
        if outcome.failures:
            self.fail_with(outcome.listing(most=1))

    # ------------------------------------------------------------------ checks

    @check("1.1")
    def test_param_count(self) -> None:
        self.all_or_nothing("1.1")

    @check("1.2")
    def test_weight_bytes(self) -> None:
        self.all_or_nothing("1.2")

    @check("1.3")
    def test_kv_cache_bytes(self) -> None:
        self.all_or_nothing("1.3")

    @check("1.4")
    def test_max_batch_one_gpu(self) -> None:
        self.all_or_nothing("1.4")

    @check("1.5")
    def test_max_batch_tensor_parallel(self) -> None:
        self.all_or_nothing("1.5")

    @check("1.6")
    def test_attention_flops(self) -> None:
        self.all_or_nothing("1.6")

    @check("1.7")
    def test_attention_bytes(self) -> None:
        self.all_or_nothing("1.7")

    @check("1.8")
    def test_arithmetic_intensity(self) -> None:
        self.all_or_nothing("1.8")

    @check("1.9")
    def test_decode_ai_independent_of_batch(self) -> None:
        self.all_or_nothing("1.9")

    @check("1.10")
    def test_answer_table(self) -> None:
        self.all_or_nothing("1.10")

    @check("1.11")
    def test_plots(self) -> None:
        problems = []
        for func in ("plot_prefill_ai", "plot_decode_ai"):
            path = self.ctx.sandbox.out_dir / f"{func}.png"
            header = {"op": "call", "func": func, "args": [str(path)], "kwargs": {}}
            self.request(header, what=f"{func}(path)", timeout=PLOT_TIMEOUT_S)
            problem = problem_with_png(path)
            if problem:
                problems.append(f"{func}: {problem}")
        if problems:
            self.fail("\n".join(problems))

    @check("1.12")
    def test_hidden_memory(self, set_score: Any = None) -> None:
        self.partial("1.12", set_score)

    @check("1.13")
    def test_hidden_attention(self, set_score: Any = None) -> None:
        self.partial("1.13", set_score)
