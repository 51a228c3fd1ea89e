"""The mutant library: known student mistakes as small edits of the reference solution.

Mutants serve twice. ``python -m grader regen`` runs them to record what each
mistake outputs, which becomes the diagnosis catalogue in the test cases; and
``python -m grader mutants`` grades each one to prove the grader catches it
(the mutant loses points) and names it (its diagnosis is in the feedback).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from grader.context import PROJECT_ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (Ubuntu 22.04, Gradescope's base image)
    import tomli as tomllib

SOLUTION = PROJECT_ROOT / "solution"


@dataclass(frozen=True)
class Mutant:
    name: str
    part: str
    file: str  # path relative to solution/
    old: str  # text replaced (must occur exactly once)
    new: str
    diagnosis: str  # completes "Likely cause: your code ..."

    def apply(self, source: str) -> str:
        """The mutated text of ``self.file``."""
        count = source.count(self.old)
        if count != 1:
            raise ValueError(f"mutant {self.name}: {self.old!r} occurs {count} times, not once")
        return source.replace(self.old, self.new)

    def materialise(self, solution: Path = SOLUTION) -> Path:
        """A temporary copy of the solution with this mutant applied; caller removes it."""
        root = Path(tempfile.mkdtemp(prefix=f"mutant-{self.name}-"))
        shutil.copytree(solution, root, dirs_exist_ok=True, ignore=_IGNORE)
        target = root / self.file
        target.write_text(self.apply(target.read_text()))
        return root


_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.png")


def load_mutants(part: str | None = None) -> list[Mutant]:
    """Every mutant in the library (of one part, if given)."""
    library = resources.files("grader").joinpath("mutant_library")
    mutants = []
    for entry in sorted(library.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        tag = entry.name.removesuffix(".toml")
        if part and tag != part:
            continue
        for item in tomllib.loads(entry.read_text())["mutant"]:
            mutants.append(Mutant(part=tag, **item))
    return mutants


@dataclass(frozen=True)
class MutantVerdict:
    mutant: Mutant
    score: float
    max_score: float
    named: bool  # the diagnosis appears in the feedback of a failed check

    @property
    def caught(self) -> bool:
        return self.score < self.max_score


def run_mutants(parts: list[str], *, limits=None) -> list[MutantVerdict]:
    """Grade every mutant of ``parts`` and report whether each was caught and named."""
    from grader.runner import grade

    verdicts = []
    for mutant in [m for p in parts for m in load_mutants(p)]:
        root = mutant.materialise()
        try:
            results = grade(
                root, results_path=root / "results.json", parts=[mutant.part], limits=limits
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)
        assert results is not None, f"grading mutant {mutant.name} crashed"
        feedback = "\n".join(t.output for t in results.tests if t.status == "failed")
        verdicts.append(
            MutantVerdict(mutant, results.score, results.max_score, mutant.diagnosis in feedback)
        )
    return verdicts
