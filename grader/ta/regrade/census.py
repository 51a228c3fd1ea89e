"""What a class got wrong, counted from its results files: the mistake census and the
distribution of every benchmark measurement. Pure functions over results data; the
class report (:mod:`grader.ta.regrade.class_page`) draws and writes them."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from grader.core.document import to_text
from grader.core.feedback import blocks_of
from grader.runtime.starvation import STARVED

#: A check's feedback is shown up to this many characters as the census's example.
EXAMPLE_CHARS = 600


#: The prefix of a cause narrowed by experiment, not drawn from a mutant library.
ISOLATED = "isolated:"


@dataclass
class Cause:
    """One named cause across the class."""

    cause: str  # the stable id (a mutant's name)
    submissions: list[str] = field(default_factory=list)  # those that made it
    checks: dict[str, int] = field(default_factory=dict)  # number -> how many, in check order
    example: str = ""  # one check's feedback naming it, without what the code printed

    @property
    def count(self) -> int:
        return len(self.submissions)

    @property
    def kind(self) -> str:
        """ "isolated": narrowed by the grader's own experiments (an ``isolated:`` id), for a
        mistake nobody listed; "known": a mistake of the part's library."""
        return "isolated" if self.cause.startswith(ISOLATED) else "known"


@dataclass(frozen=True)
class Measure:
    """One benchmark criterion across the class: every submission's median ratio."""

    key: str
    label: str
    limit: float
    at_least: bool
    values: tuple[float, ...]


def named_causes(data: dict[str, Any]) -> dict[str, set[str]]:
    """cause id -> the checks of one results file that named it (failed checks only)."""
    named: dict[str, set[str]] = defaultdict(set)
    for test in data.get("tests", []):
        if test.get("status") == "failed":
            for cause in (test.get("extra_data") or {}).get("causes") or []:
                named[str(cause)].add(str(test.get("number", "")))
    return dict(named)


def submission_causes(data: dict[str, Any]) -> set[str]:
    """The causes one submission is counted under (see :func:`counted`)."""
    return counted(named_causes(data))


def counted(named: dict[str, set[str]]) -> set[str]:
    """Of the causes ``named`` (cause -> checks), those a submission is counted under. A
    cause named only beside another (every check that names it names the other too, and
    the other more often) is that other's look-alike on some inputs, not a second mistake:
    it is not counted."""
    return {
        cause
        for cause, checks in named.items()
        if not any(
            other != cause and checks <= more and len(more) > len(checks)
            for other, more in named.items()
        )
    }


def example_text(test: dict[str, Any], page: dict[str, Any] | None = None) -> str:
    """A check's feedback as an anonymous example, in plain text: what the submission
    printed is cut (``page``: its results' ``extra_data``)."""
    blocks = blocks_of(test, page or {})
    at = next((i for i, b in enumerate(blocks) if b["kind"] == "code"), len(blocks))
    if at < len(blocks) and at and blocks[at - 1]["kind"] == "paragraph":
        at -= 1  # its "Your code printed:" line
    text = to_text(blocks[:at])
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + " [...]"


def natural_key(name: str) -> list[tuple[int, Any]]:
    """Sort ``submission_9`` before ``submission_10``, and check 1.3 before 1.10."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"(\d+)", name)]


def census(results: dict[str, dict[str, Any]]) -> list[Cause]:
    """Per named cause, which submissions made it (most frequent first), the checks that
    named it and one example message. ``results``: submission id -> results data."""
    causes: dict[str, Cause] = {}
    for sub_id, data in results.items():
        named = named_causes(data)
        for cause in sorted(counted(named)):
            entry = causes.setdefault(cause, Cause(cause))
            entry.submissions.append(sub_id)
            for number in named[cause]:
                entry.checks[number] = entry.checks.get(number, 0) + 1
            if not entry.example:
                test = next(
                    t
                    for t in data["tests"]
                    if cause in (t.get("extra_data") or {}).get("causes", [])
                )
                example = example_text(test, data.get("extra_data"))
                entry.example = f"{test.get('name', '')}\n\n{example}"
    for entry in causes.values():
        entry.checks = dict(sorted(entry.checks.items(), key=lambda kv: natural_key(kv[0])))
    return sorted(causes.values(), key=lambda c: (-c.count, c.cause))


def measures(results: dict[str, dict[str, Any]]) -> list[Measure]:
    """Every benchmark criterion graded in the class, with each submission's median."""
    found: dict[str, dict[str, Any]] = {}
    values: dict[str, list[float]] = defaultdict(list)
    for data in results.values():
        benchmarks = (data.get("extra_data") or {}).get("benchmarks") or {}
        for record in benchmarks.values():
            for c in record.get("criteria", []):
                key = f"{record.get('check', '')} {c.get('label', '')}"
                found.setdefault(key, c)
                median = (c.get("ratio") or {}).get("median")
                if isinstance(median, int | float):
                    values[key].append(float(median))
    return [
        Measure(
            key,
            str(c.get("label", "")),
            float(c.get("limit", 0.0)),
            bool(c.get("at_least")),
            tuple(values[key]),
        )
        for key, c in found.items()
    ]


def census_records(causes: list[Cause], submissions: int) -> list[dict[str, Any]]:
    """The census as ``summary.json`` keeps it: per cause, how many submissions made it
    (and their share of the class), which ones, the checks that named it and the example."""
    return [
        {
            "cause": c.cause,
            "kind": c.kind,
            "submissions": c.count,
            "percent": round(100 * c.count / submissions, 1) if submissions else 0.0,
            "submission_ids": list(c.submissions),
            "checks": dict(c.checks),
            "example": c.example,
        }
        for c in causes
    ]


CENSUS_MD = """
## Mistake census

How many submissions each named mistake was found in, most frequent first: what to
explain in the next lecture. A cause is *known* (a mistake of the part's library) or
*isolated* (a mistake nobody listed, narrowed by the grader's experiments: the argument a
function ignores, the factor a value is off by). A cause named only beside another (its
look-alike on some input) is not counted as a second mistake. Examples: `report.html`.

"""


def census_markdown(causes: list[Cause], submissions: int) -> str:
    """The census as a section of ``summary.md``: a table of cause, submissions, share of
    the class and the checks that named it (how many times each)."""
    if not causes:
        return CENSUS_MD + "No known mistake was named.\n"
    rows = [
        f"| `{r['cause']}` | {r['kind']} | {r['submissions']} | {r['percent']:.0f} | "
        + ", ".join(f"{n} ({k})" for n, k in r["checks"].items())
        + " |"
        for r in census_records(causes, submissions)
    ]
    head = (
        "| cause | kind | submissions | % | named by check (how many) |\n"
        "| --- | --- | --- | --- | --- |\n"
    )
    return CENSUS_MD + head + "\n".join(rows) + "\n"


def timing_doubts(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every timed check of the class its runs decided late or not at all (``undecided``
    and ``decided_late`` of its benchmark record), and every check a request of which timed
    out on a busy machine (``starved`` in its ``extra_data``: the code was ready to run and
    the CPU went elsewhere): which submission, which check, which criteria or requests, and
    whether it passed. A TA may time these again on a quiet machine."""
    found = []
    for sub_id in sorted(results, key=natural_key):
        benchmarks = (results[sub_id].get("extra_data") or {}).get("benchmarks") or {}
        for check, record in sorted(benchmarks.items(), key=lambda kv: natural_key(kv[0])):
            undecided, late = record.get("undecided") or [], record.get("decided_late") or []
            if undecided or late:
                found.append(
                    {"submission": sub_id, "check": check, "passed": record.get("passed"),
                     "undecided": list(undecided), "decided_late": list(late)}
                )  # fmt: skip
        found += starved_checks(sub_id, results[sub_id])
    return found


def starved_checks(sub_id: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks of one results file whose requests a busy machine starved, as entries of
    :func:`timing_doubts` (``starved`` True; the requests named under ``undecided``)."""
    found = []
    for test in data.get("tests", []):
        events = (test.get("extra_data") or {}).get(STARVED) or []
        if not isinstance(events, list) or not events:
            continue
        requests = [
            f"{e.get('request', '?')} timed out on a busy machine"
            for e in events
            if isinstance(e, dict)
        ]
        found.append(
            {"submission": sub_id, "check": str(test.get("number", "")),
             "passed": test.get("status") == "passed", "undecided": requests,
             "decided_late": [], "starved": True}
        )  # fmt: skip
    return found
