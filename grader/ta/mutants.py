"""The mutant library: known student mistakes as small edits of the reference solution.

Mutants serve twice. ``python -m grader regen`` runs them to record what each
mistake outputs, which becomes the diagnosis catalogue in the test cases; and
``python -m grader mutants`` grades each one to prove the grader catches it
(the mutant loses points) and names it (its diagnosis is in the feedback).
"""

from __future__ import annotations

import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from grader.core.paths import MUTANT_LIBRARY, SOLUTION, SOLUTION_COPY_PATTERNS


@dataclass(frozen=True)
class Mutant:
    """A known mistake (or, with ``variant=True``, a correct rewrite) of the reference.

    ``edits`` are (old, new) text replacements of ``file``; each ``old`` must
    occur exactly once, so a mutant that no longer applies is reported at once.
    """

    name: str
    part: str
    file: str  # path relative to solution/
    edits: tuple[tuple[str, str], ...]
    diagnosis: str = ""  # completes "Likely cause: your code ..."; empty for variants
    variant: bool = False  # a correct variant: must keep full marks
    # A variant whose timed checks look at what it changed (a cache kept another way: the
    # benchmark's probes look at the cache): the project's tests grade it with them too.
    timed: bool = False
    combines: tuple[str, ...] = ()  # several mistakes at once: their names, each to be named
    # Files the rewrite adds beside the solution's (a helper module of the student's own),
    # as (path relative to solution/, text).
    files: tuple[tuple[str, str], ...] = ()

    @property
    def diagnoses(self) -> tuple[str, ...]:
        """The texts the feedback must contain for this mistake to count as named."""
        return (self.diagnosis,) if not self.combines else tuple(self.diagnosis.split("\n"))

    def apply(self, source: str) -> str:
        """The mutated text of ``self.file``."""
        for old, new in self.edits:
            count = source.count(old)
            if count != 1:
                raise ValueError(f"mutant {self.name}: {old!r} occurs {count} times, not once")
            source = source.replace(old, new)
        return source

    def materialise(self, solution: Path = SOLUTION) -> Path:
        """A temporary copy of the solution with this mutant applied; caller removes it."""
        return materialise_all([self], solution, prefix=f"mutant-{self.name}-")


_IGNORE = shutil.ignore_patterns(*SOLUTION_COPY_PATTERNS)


def materialise_all(
    mutants: list[Mutant], solution: Path = SOLUTION, prefix: str = "mutants-"
) -> Path:
    """A temporary copy of the solution with every one of ``mutants`` applied (each to its
    own file; several may share one); the caller removes it."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    shutil.copytree(solution, root, dirs_exist_ok=True, ignore=_IGNORE)
    for mutant in mutants:
        target = root / mutant.file
        target.write_text(mutant.apply(target.read_text()))
        for path, text in mutant.files:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
    return root


def _entry(tag: str, item: dict, variant: bool) -> Mutant:
    edits = [(e["old"], e["new"]) for e in item.get("edit", [])]
    if "old" in item:
        edits.insert(0, (item["old"], item["new"]))
    if not edits:
        raise ValueError(f"mutant {item.get('name')!r} of {tag} has no edit")
    return Mutant(
        name=item["name"],
        part=tag,
        file=item["file"],
        edits=tuple(edits),
        diagnosis=item.get("diagnosis", ""),
        variant=variant,
        timed=bool(item.get("timed", False)),
        files=tuple((f["path"], f["text"]) for f in item.get("new_file", [])),
    )


def _combined(item: dict, tag: str, singles: dict[str, Mutant]) -> Mutant:
    """Several known mistakes at once: every edit of each, every diagnosis to be named."""
    parts = [singles[name] for name in item["combines"]]
    if len(parts) < 2 or len({m.file for m in parts}) != 1:
        raise ValueError(f"mutant {item['name']!r} must combine mistakes of one file")
    return Mutant(
        name=item["name"],
        part=tag,
        file=parts[0].file,
        edits=tuple(e for m in parts for e in m.edits),
        diagnosis="\n".join(m.diagnosis for m in parts),
        combines=tuple(item["combines"]),
    )


def load_mutants(
    part: str | None = None, *, variants: bool = False, combined: bool = True
) -> list[Mutant]:
    """The library's mistakes (of one part, if given); with ``variants``, its correct rewrites.

    Entries with ``combines`` put several mistakes into one submission (their names must
    all appear in its feedback); ``combined=False`` leaves them out, as the diagnosis
    catalogue records single mistakes only.
    """
    found = []
    for entry in sorted(MUTANT_LIBRARY.glob("part*.toml")):
        tag = entry.stem
        if part and tag != part:
            continue
        data = tomllib.loads(entry.read_text())
        if variants:
            found += [_entry(tag, item, True) for item in data.get("variant", [])]
            continue
        items = data.get("mutant", [])
        singles = {i["name"]: _entry(tag, i, False) for i in items if "combines" not in i}
        for item in items:
            if "combines" not in item:
                found.append(singles[item["name"]])
            elif combined:
                found.append(_combined(item, tag, singles))
    return found


@dataclass(frozen=True)
class MutantVerdict:
    mutant: Mutant
    score: float
    max_score: float
    named: bool  # the diagnosis appears in the feedback of a failed check

    @property
    def full_marks(self) -> float:
        """What the reference scores on the checks graded: their maximum and the part's
        bonus (Part 4's int8 points, which the solution earns)."""
        from grader.core.points import bonus_total

        return self.max_score + bonus_total(self.mutant.part)

    @property
    def caught(self) -> bool:
        return self.score < self.full_marks

    @property
    def ok(self) -> bool:
        """A mistake caught and named, or a correct variant at full marks (the bonus too)."""
        if self.mutant.variant:
            return self.score == self.full_marks
        return self.caught and self.named


def run_mutants(
    parts: list[str],
    *,
    limits=None,
    names: list[str] | None = None,
    benchmarks: bool = True,
) -> list[MutantVerdict]:
    """Grade every mutant and correct variant of ``parts`` (or only those in ``names``);
    without the timed benchmark checks when ``benchmarks`` is False."""
    from grader.grading.runner import grade

    verdicts = []
    library = [m for p in parts for m in load_mutants(p) + load_mutants(p, variants=True)]
    for mutant in [m for m in library if names is None or m.name in names]:
        root = mutant.materialise()
        try:
            results = grade(
                root,
                results_path=root / "results.json",
                parts=[mutant.part],
                limits=limits,
                skip_tags=frozenset() if benchmarks else frozenset({"benchmark"}),
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        assert results is not None, f"grading mutant {mutant.name} crashed"
        feedback = "\n".join(t.output for t in results.tests if t.status == "failed")
        named = bool(mutant.diagnosis) and all(d in feedback for d in mutant.diagnoses)
        verdicts.append(MutantVerdict(mutant, results.score, results.max_score, named))
    return verdicts
