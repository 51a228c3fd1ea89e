"""What a check says about a submission, as data: the items its feedback is laid out from.

A check hands its feedback over as these small records rather than as sentences to be
read back: the failing cases (:class:`Case`, :class:`LogitCase`), the likely causes it
named (:class:`Cause`), the tables of what it measured (:class:`Measurement`), plain lines
of its own (notes, advice) and what the submission printed, gathered in one
:class:`Feedback` per check run. :mod:`grader.core.feedback` lays the blocks out from the
fields (a case's label, expected and got; a cause's sentence), never from the wording, so
rewording a sentence changes no table, and :meth:`Feedback.text` writes the same items as
the plain message of the check (its ``output`` in the runner's results: the console's
progress lines and logs).

Every item is plain JSON (:meth:`Feedback.to_json`): the grading keeps a check's items in
its results' ``extra_data`` (:data:`ITEMS`) from the check to the renderer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from grader.core.results import truncate

#: The ``extra_data`` key under which a check's items travel from the check to the
#: renderer (dropped from the file Gradescope reads, which keeps the blocks instead).
ITEMS = "feedback_items"
#: A check's own lines are kept up to this many characters (their start and end): twice
#: what the page shows (results.MAX_TEST_OUTPUT_CHARS), since a check's messages quote
#: what the submission returned, and the blocks are kept in the results file too.
MAX_CHECK_TEXT_CHARS = 16_000
#: Joins the ids of the mistakes one cause names at once ("no_output_head+two_matrix_ffn").
JOIN = "+"
#: Where a plain message goes on with what the submission printed (:func:`with_output`).
PRINTED = "\n\nYour code printed:\n"


@dataclass(frozen=True)
class Case:
    """A failing case: its label, what it returned (or what happened instead), and how a
    returned value was compared ("" where no value was compared, as when it raised).
    ``remark`` says more about this case (the check its wrong value follows from)."""

    label: str
    got: str
    how: str = ""
    remark: str = ""

    def expected(self) -> str:
        """The expected column: the grader never shows the right value itself."""
        return f"the right value ({self.how})" if self.how else ""

    def row(self) -> list[str]:
        return [self.label, self.expected(), self.got]

    def sentence(self) -> str:
        if self.how:
            line = f"{self.label} returned {self.got}, which is wrong ({self.how})."
        else:
            line = f"{self.label}: {self.got}"
        return f"{line} {self.remark}" if self.remark else line


@dataclass(frozen=True)
class LogitCase:
    """A case whose logits were off: the largest error, the tolerance, and the first
    position that was wrong ("position 2 of 8"; "" where not known)."""

    label: str
    error: float
    tolerance: float
    where: str = ""

    def expected(self) -> str:
        return f"logits within {self.tolerance:g} of the reference's"

    def row(self) -> list[str]:
        where = f", first at {self.where}" if self.where else ""
        return [self.label, self.expected(), f"off by up to {self.error:.3g}{where}"]

    def sentence(self) -> str:
        where = f"; first wrong {self.where}" if self.where else ""
        return (
            f"{self.label}: logits differ from the reference's by up to {self.error:.3g} "
            f"(tolerance {self.tolerance:g}){where}."
        )


@dataclass(frozen=True)
class Cause:
    """A likely cause the check named: its stable id (the mutant library's name, counted
    by the class census), the sentence a student reads ("your code ..." with its own
    subject), and the evidence that singled it out."""

    id: str
    text: str
    evidence: str = ""


@dataclass(frozen=True)
class Measurement:
    """A table of what a check measured: its column names and its rows of cells."""

    header: list[str]
    rows: list[list[str]]


@dataclass
class Feedback:
    """Everything one check run says, in the order a reader meets it: the count of cases
    right, the likely causes, lines before the cases, the failing cases (``more`` of them
    left out), lines after them, measurements, and what the submission printed.

    ``ended`` is set when the check failed with a message of its own (:meth:`end`); a
    check that passed ends on its items too, and one stopped another way (an exception of
    the grader's) has its output shown as it is."""

    count: str = ""
    causes: list[Cause] = field(default_factory=list)
    lead: list[str] = field(default_factory=list)
    cases: list[Case | LogitCase] = field(default_factory=list)
    more: int = 0
    notes: list[str] = field(default_factory=list)
    tables: list[Measurement] = field(default_factory=list)
    printed: str = ""
    ended: bool = False

    # ------------------------------------------------------------------ building

    def name(self, causes: list[Cause]) -> None:
        """Add ``causes``, each (id and sentence) once."""
        for cause in causes:
            if all((c.id, c.text) != (cause.id, cause.text) for c in self.causes):
                self.causes.append(cause)

    def line(self, text: str) -> None:
        """A plain line of the check's own (before the cases while none is listed yet);
        what a message says the submission printed (:data:`PRINTED`) is kept apart."""
        text, _, printed = text.partition(PRINTED)
        if printed.strip() and not self.printed:
            self.printed = printed
        for x in truncate(text, MAX_CHECK_TEXT_CHARS).splitlines():
            if x.strip():
                (self.notes if self.cases else self.lead).append(x)

    def add(self, item: Case | LogitCase | str) -> None:
        """A failing case, or a plain line (a failure that is not one case's)."""
        if isinstance(item, str):
            self.line(item)
        else:
            self.cases.append(item)

    def end(self, message: str) -> None:
        """The check failed with ``message``: a plain message of its own joins the items as
        its lines (a message written from the items, :meth:`text`, is theirs already)."""
        if not self.ended:
            self.line(message)
        self.ended = True

    def cause_ids(self) -> list[str]:
        """The named causes' ids, each once (``extra_data["causes"]``): a cause that is
        several mistakes at once is counted as each of them (its id joins theirs with
        :data:`JOIN`)."""
        return list(dict.fromkeys(i for c in self.causes for i in c.id.split(JOIN) if i))

    # ------------------------------------------------------------------ plain text

    def text(self) -> str:
        """The items as the check's plain message (the count is printed apart)."""
        lines = [*self.lead, *(c.sentence() for c in self.cases)]
        if self.more:
            lines.append(more_text(self.more))
        lines += [*self.notes, *cause_lines(self.causes)]
        message = "\n".join(lines)
        return f"{message}{PRINTED}{self.printed.strip()}" if self.printed.strip() else message

    # ------------------------------------------------------------------ as JSON

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cases"] = [{"kind": type(c).__name__, **asdict(c)} for c in self.cases]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Feedback | None:
        """The items of :meth:`to_json`; None for anything else (a results file may hold
        anything)."""
        if not isinstance(data, dict):
            return None
        try:
            kinds = {"Case": Case, "LogitCase": LogitCase}
            cases = [kinds[c.pop("kind")](**c) for c in (dict(c) for c in data["cases"])]
            return cls(
                count=str(data["count"]),
                causes=[Cause(**c) for c in data["causes"]],
                lead=[str(x) for x in data["lead"]],
                cases=cases,
                more=int(data["more"]),
                notes=[str(x) for x in data["notes"]],
                tables=[Measurement(**m) for m in data["tables"]],
                printed=str(data["printed"]),
                ended=bool(data["ended"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def more_text(more: int) -> str:
    """The line that says a list of failing cases was cut."""
    return f"(and {more} more failing case{'s' if more > 1 else ''})"


def cause_lines(causes: list[Cause]) -> list[str]:
    """The causes as the plain message's sentence ("Likely cause: A; or B.")."""
    return [f"Likely cause: {'; or '.join(c.text for c in causes)}."] if causes else []
