"""Scores, survivor lists and the triage of ``make mutation`` (see ``grader/ta/mutation.py``).

The triage file (``docs/mutation/triage.toml``) holds one ``[[survivor]]`` entry per
mutant the checks once let through, named by part, file, function and the mutated
line before and after. Each is ``status = "equivalent"`` with a one-line ``reason``
(the edit changes nothing the handout asks for), ``status = "killed"`` with the
``check`` added to catch it, or ``status = "open"`` with a ``reason``: a real hole not
closed yet, which counts against the score. A run is clean when every survivor has an
equivalent or open entry, every such entry of a part that ran still survives (else it
is stale), no killed entry survives, and each part kills at least ``TARGET`` of its
non-equivalent mutants.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from grader.core.paths import PROJECT_ROOT

TRIAGE = PROJECT_ROOT / "docs" / "mutation" / "triage.toml"
TARGET = 0.95
STATUSES = ("equivalent", "open", "killed")


@dataclass(frozen=True)
class Entry:
    part: str
    file: str
    function: str
    old: str
    new: str
    status: str
    reason: str = ""
    check: str = ""

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.part, self.file, self.function, self.old, self.new)

    @property
    def check_numbers(self) -> frozenset[str]:
        """The check numbers a "killed" entry names before its first comma ("4.8, ...")."""
        return frozenset(re.findall(r"\b\d+\.\d+\b", self.check.split(",")[0]))


def load_triage(path: Path = TRIAGE) -> list[Entry]:
    """The triage entries; a malformed or duplicated entry raises ValueError."""
    if not Path(path).exists():
        return []
    data = tomllib.loads(Path(path).read_text())
    entries, seen = [], set()
    for n, item in enumerate(data.get("survivor", []), 1):
        try:
            entry = Entry(**item)
        except TypeError as exc:
            raise ValueError(f"triage entry {n}: {exc}") from None
        if entry.status not in STATUSES:
            raise ValueError(f"triage entry {n}: status must be one of {STATUSES}")
        if entry.status != "killed" and not entry.reason.strip():
            raise ValueError(f"triage entry {n}: an {entry.status} mutant needs a reason")
        if entry.status == "killed" and not entry.check.strip():
            raise ValueError(f"triage entry {n}: a killed mutant names the check that kills it")
        if entry.key in seen:
            raise ValueError(f"triage entry {n} repeats an earlier one")
        seen.add(entry.key)
        entries.append(entry)
    return entries


def triage_problems(mutants: list, entries: list[Entry], parts: list[str]) -> list[str]:
    """What is wrong with the triage for a run of ``parts`` (empty: clean)."""
    survivors = {m.key: m for m in mutants if m.outcome == "survived"}
    graded = {m.key for m in mutants}
    by_key = {e.key: e for e in entries if e.part in parts}
    problems = []
    for key, m in survivors.items():
        entry = by_key.get(key)
        if entry is None:
            problems.append(f"untriaged survivor: {_describe(m)}")
        elif entry.status == "killed":
            problems.append(f"marked killed by {entry.check} but survives: {_describe(m)}")
    for key, entry in by_key.items():
        if entry.status != "killed" and key not in survivors:
            where = "no longer survives" if key in graded else "is no longer generated"
            problems.append(f"stale {entry.status} entry ({where}): {_describe(entry)}")
    return problems


def _describe(m) -> str:
    return f"{m.part} {m.file}:{m.function}: `{m.old}` -> `{m.new}`"


@dataclass(frozen=True)
class Score:
    part: str
    mutants: int
    killed: int
    survived: int
    equivalent: int
    other: int  # incompetent or no mutation made: neither killed nor survived
    seconds: float

    @property
    def score(self) -> float:
        """Killed share of the non-equivalent mutants (1.0 when there are none)."""
        relevant = self.killed + self.survived - self.equivalent
        return self.killed / relevant if relevant else 1.0


def score(part: str, mutants: list, entries: list[Entry], seconds: float) -> Score:
    equivalent = {e.key for e in entries if e.status == "equivalent"}
    outcomes = [m.outcome for m in mutants]
    return Score(
        part=part,
        mutants=len(mutants),
        killed=outcomes.count("killed"),
        survived=outcomes.count("survived"),
        equivalent=sum(1 for m in mutants if m.outcome == "survived" and m.key in equivalent),
        other=sum(1 for o in outcomes if o not in ("killed", "survived")),
        seconds=seconds,
    )


def render(scores: list[Score], mutants: list, entries: list[Entry], problems: list[str]) -> str:
    """The report as Markdown: the score table, then every survivor with its triage."""
    by_key = {e.key: e for e in entries}
    lines = [
        "| part | mutants | killed | survived | equivalent | other | score | run time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        lines.append(
            f"| {s.part} | {s.mutants} | {s.killed} | {s.survived} | {s.equivalent} | {s.other} "
            f"| {s.score:.1%} | {s.seconds / 60:.1f} min |"
        )
    lines += ["", "Surviving mutants:", ""]
    survivors = [m for m in mutants if m.outcome == "survived"]
    for m in survivors:
        entry = by_key.get(m.key)
        why = f"{entry.status}: {entry.reason or entry.check}" if entry else "NOT TRIAGED"
        lines.append(f"* {m.part} `{m.file}:{m.line}` {m.function}, {m.operator}:")
        lines.append(f"  `{m.old}` -> `{m.new}` ({why})")
    if not survivors:
        lines.append("(none)")
    if problems:
        lines += ["", "Triage problems:", "", *[f"* {p}" for p in problems]]
    return "\n".join(lines) + "\n"


def finish(runs: dict[str, tuple[list, float]], triage: Path, workdir: Path) -> int:
    """Score each part's run, check the triage, write the report; 0 when clean and on
    target."""
    entries = load_triage(triage)
    mutants = [m for found, _ in runs.values() for m in found]
    scores = [score(p, found, entries, secs) for p, (found, secs) in runs.items()]
    problems = triage_problems(mutants, entries, list(runs))
    text = render(scores, mutants, entries, problems)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "report.md").write_text(text)
    (workdir / "report.json").write_text(
        json.dumps(
            {
                "scores": [{**asdict(s), "score": s.score} for s in scores],
                "mutants": [asdict(m) for m in mutants],
                "problems": problems,
            },
            indent=1,
        )
    )
    print(text, end="")
    print(f"report written to {workdir / 'report.md'}")
    below = [s.part for s in scores if not s.score >= TARGET]
    if below:
        print(f"below the {TARGET:.0%} target: {', '.join(below)}")
    return 1 if problems or below else 0
