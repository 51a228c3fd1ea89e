"""Synthetic Gradescope "Export Submissions" folders for the batch regrader's tests.

An export is ``submission_metadata.yml`` (Ruby-symbol keys, as Gradescope writes
them) plus one ``submission_<id>/`` folder per submission: copies of the reference
solution and of the blank skeleton, every Part 1 mutant of the library, and two
misbehaving submissions (one never returns from a function, one kills its worker
at import).
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from grader.ta.mutants import load_mutants
from tests.conftest import ASSIGNMENT, SOLUTION

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.png")

#: Part 1's answer_table never returns: only check 1.10 (1 point) calls it, so the
#: grader's 20 s request timeout is paid once. "hang" spins on the CPU all that time, as
#: an endless loop does; "hang:sleep" waits (on input, a lock), which costs the machine
#: nothing and follows the same path through the grader.
HANG_ANCHOR = '    """The assignment\'s answer table, in the handout\'s units (GiB, billions)."""\n'
HANG_EDITS = {
    "hang": HANG_ANCHOR + "    while True:\n        pass\n",
    "hang:sleep": HANG_ANCHOR + "    while True:\n        __import__('time').sleep(60)\n",
}
#: Appended to question1.py: the worker process exits while importing it.
CRASH_CODE = "\nimport os\n\nos._exit(3)\n"


@dataclass
class Entry:
    """One submission of a synthetic export."""

    folder: str
    kind: str  # "solution", "blank", "mutant:<name>", "hang", "hang:sleep", "crash"
    submitters: list[dict[str, str]] = field(default_factory=list)
    in_metadata: bool = True
    plain_keys: bool = False  # write keys without the leading colon


def _edit(root: Path, old: str, new: str) -> None:
    target = root / "question1.py"
    text = target.read_text()
    assert text.count(old) == 1, f"anchor {old!r} must occur exactly once"
    target.write_text(text.replace(old, new))


def _write_submission(entry: Entry, dest: Path) -> None:
    if entry.kind.startswith("mutant:"):
        mutant = next(m for m in load_mutants("part1") if m.name == entry.kind[7:])
        tmp = mutant.materialise()
        try:
            shutil.copytree(tmp, dest, ignore=_IGNORE)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    shutil.copytree(ASSIGNMENT if entry.kind == "blank" else SOLUTION, dest, ignore=_IGNORE)
    if entry.kind in HANG_EDITS:
        _edit(dest, HANG_ANCHOR, HANG_EDITS[entry.kind])
    elif entry.kind == "crash":
        with open(dest / "question1.py", "a") as f:
            f.write(CRASH_CODE)


def metadata_yaml(entries: list[Entry]) -> str:
    """The metadata file as Gradescope writes it (colon keys unless ``plain_keys``)."""
    lines = []
    for e in (e for e in entries if e.in_metadata):
        c = "" if e.plain_keys else ":"
        lines += [f"{e.folder}:", f"  {c}submitters:"]
        for person in e.submitters:
            lines += [
                f"  - {c}name: {person['name']}",
                f"    {c}sid: '{person['sid']}'",
                f"    {c}email: {person['email']}",
            ]
        lines += [
            f"  {c}created_at: 2026-10-01 12:00:00.000000000 -07:00",
            f"  {c}score: 12.0",
            f"  {c}status: processed",
        ]
    return "\n".join(lines) + "\n"


def plan_export(seed: int = 0, hang: str = "hang") -> list[Entry]:
    """20 submissions with seeded ids and submitters: 4 solutions (one absent from the
    metadata, one by two students, one with plain keys), 2 blanks, 12 mutants, a hang of
    the kind ``hang`` and a crash."""
    rng = random.Random(seed)
    single = [m for m in load_mutants("part1") if not m.combines]  # one named cause each
    kinds = ["solution"] * 4 + ["blank"] * 2 + [f"mutant:{m.name}" for m in single]
    kinds += [hang, "crash"]
    ids = rng.sample(range(100_000_000, 1_000_000_000), len(kinds))
    entries = []
    for i, (kind, sid) in enumerate(zip(kinds, ids, strict=True)):
        student = {"name": f"Student {i}", "sid": str(1000 + i), "email": f"s{i}@example.edu"}
        entries.append(Entry(f"submission_{sid}", kind, [student]))
    entries[1].submitters.append({"name": "Partner B", "sid": "2001", "email": "b@example.edu"})
    entries[2].in_metadata = False
    entries[3].plain_keys = True
    return entries


def build_export(dest: Path, entries: list[Entry]) -> Path:
    """Write the export for ``entries`` under ``dest`` and return ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        _write_submission(entry, dest / entry.folder)
    (dest / "submission_metadata.yml").write_text(metadata_yaml(entries))
    return dest
