"""The assignment's parts: one declaration each, ``grader/parts/<tag>/part.toml``.

Each part is one folder, ``grader/parts/<tag>/``:

- ``part.toml``: the part's declaration, read here. Everything the grader, the self-check
  and the TA tooling need to know about the part is written there once: the files a
  student hands in, what its fork server preloads, its table of checks (number, title,
  points, hidden or public, partial credit, timed, the public checks that stand for a
  hidden one in the self-check, the handout's row), and its TA tooling (the order its
  cases are built in, its mutation targets and timeout, the cache-free baselines that
  calibration times). ``tests/test_parts.py`` walks every folder and fails when any of it
  is missing or disagrees with the code;
- ``checks.py`` (with ``support.py``, ``timed.py``, ``diagnosis.py`` where the part needs
  them): the part's checks, trusted, run in the grader;
- ``cases.py``: the constants and seeded data both the checks and the builder use;
- ``build.py`` (and ``build_*.py``): builds the part's test cases and diagnosis catalogue
  from ``solution/`` (``python -m grader regen``); TA-side only, never in the autograder zip;
- ``adapter.py`` (and ``adapter_*.py`` beside it): the worker side, the only files that
  touch student code. They are copied into each sandbox as ``adapter_<tag>.py`` (and
  ``adapter_<tag>_*.py``) and import nothing of the grader.

A part may hold more modules of its own (Part 1's ``seal.py``: the write-up answers sealed
in the public cases students get). Its mutant library is TA tooling, in
``grader/ta/mutants/<tag>.toml``.

The shared machinery sits beside them: ``grader/judging`` (base classes, logit
comparison, timed pools), ``grader/worker`` (the worker's main loop, protocol and
value encoding), the client, sandbox, timing and results modules.
"""

from __future__ import annotations

import string
import tomllib
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

#: Where the parts' folders are; each with a ``part.toml`` is a part, in the order of tags.
PARTS_DIR = Path(__file__).resolve().parents[1] / "parts"
DECLARATION = "part.toml"


@dataclass(frozen=True)
class CheckDeclaration:
    """One graded check, as the part's table declares it."""

    number: str  # "2.9": the number on Gradescope and in the handout
    title: str  # the check's name on the page, after its number ({...} fields filled in)
    handout: str  # the "what" of the handout's "How it is graded" row ({...} filled in)
    points: float = 0.0  # its weight; 0 for a bonus check
    bonus: float = 0.0  # extra credit awarded when passed (maximum 0: Gradescope's bonus)
    partial: bool = False  # scored by the share of cases right
    hidden: bool = False  # its cases only Gradescope has (left out of the self-check)
    timed: bool = False  # timed against the reference solution in the same grading
    benchmark: bool = False  # the part's benchmark, judged on thresholds.toml's profile
    # Hidden: the public checks that run the same code on public data in the self-check.
    public_counterparts: tuple[str, ...] = ()
    # Its timed runs are also compared with the reference's answers on hidden prompt pools
    # on Gradescope; in the self-check they are timed on prompts of their own.
    hidden_prompt_pools: bool = False


@dataclass(frozen=True)
class PartTooling:
    """What the TA tooling needs to know about a part."""

    regen_order: int  # cases built in this order (the slowest builder first)
    mutation_timeout_s: int  # seconds one engine mutant may take to grade
    # Per file, the functions students write ("Class.method" for methods): the engine's
    # mutation targets.
    mutation_targets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The mutant that hides a cache-free design behind correct outputs (a benchmark part's
    # calibration baseline), and those that come closer to the reference.
    cache_free_baseline: str = ""
    cache_free_extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class Part:
    tag: str  # "part1" ... "part4": the tag on every check of the part
    title: str
    main_file: str  # the file the submission must contain, relative to its folder
    # What its adapter imports before the student's code (``module`` or
    # ``module:name,...``), loaded once by a fork server that starts its workers. Each
    # part's list holds the one before it, so that one server grows with the grading
    # (numpy, then torch, then transformers: ``ForkServer.extend``).
    preload: tuple[str, ...] = ()
    # Whether that server may import the next part's libraries while this part's workers
    # run (``ForkServer.import_ahead``): true where they are small, so the next part finds
    # its libraries imported instead of waiting for them; false where the server's growth
    # would add to the grading's peak memory, which Part 3's workers set.
    import_next_beside: bool = False
    # What a class regrade's shared server imports as well, once for every grading it
    # serves: libraries the part's workers import themselves (Part 1's plots), worth
    # importing once for a class but not in one grading's memory (matplotlib: 31 MiB).
    class_preload: tuple[str, ...] = ()
    # The files a student edits besides ``main_file`` (each must be uploaded), and the
    # assignment's files they need not edit: the kit supplies those an upload lacks.
    also_edited: tuple[str, ...] = ()
    given: tuple[str, ...] = ()
    # Whether ``main_file`` may come as a Jupyter notebook of the same name (the course's
    # lab handout accepts one): graded as the script it defines (grader/sandbox/notebook.py).
    notebook: bool = False
    checks: tuple[CheckDeclaration, ...] = ()
    ta: PartTooling = PartTooling(regen_order=0, mutation_timeout_s=0)

    @property
    def number(self) -> int:
        """``part3`` -> 3: the first number of its checks."""
        return int(self.tag.removeprefix("part"))

    @property
    def checks_module(self) -> str:
        """The module holding the part's unittest.TestCase classes."""
        return f"grader.parts.{self.tag}.checks"

    @property
    def edited(self) -> tuple[str, ...]:
        """Every file of the part a student must upload, ``main_file`` first."""
        return (self.main_file, *self.also_edited)

    def check(self, number: str) -> CheckDeclaration:
        """The declaration of check ``number`` (KeyError if the part has none)."""
        for declared in self.checks:
            if declared.number == number:
                return declared
        raise KeyError(f"{self.tag} declares no check {number}")


def _tuple_fields(table: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: tuple(v) if k in names else v for k, v in table.items()}


def load_part(folder: Path) -> Part:
    """The part declared in ``folder/part.toml`` (its tag is the folder's name)."""
    data = tomllib.loads((folder / DECLARATION).read_text())
    checks = tuple(
        CheckDeclaration(**_tuple_fields(c, ("public_counterparts",)))
        for c in data.pop("checks", [])
    )
    ta = data.pop("ta")
    targets = {f: tuple(names) for f, names in ta.pop("mutation_targets", {}).items()}
    tooling = PartTooling(mutation_targets=targets, **_tuple_fields(ta, ("cache_free_extra",)))
    lists = ("preload", "class_preload", "also_edited", "given")
    return Part(folder.name, checks=checks, ta=tooling, **_tuple_fields(data, lists))


def load_parts(root: Path = PARTS_DIR) -> dict[str, Part]:
    """Every part declared under ``root``, by tag, in the order of their numbers."""
    folders = [p.parent for p in root.glob(f"*/{DECLARATION}")]
    parts = [load_part(folder) for folder in folders]
    return {p.tag: p for p in sorted(parts, key=lambda p: p.number)}


PARTS: dict[str, Part] = load_parts()


def fill(text: str, **values: Any) -> str:
    """``text`` with its ``{...}`` fields filled from ``values`` (``{cases.WORK_NEW}``,
    ``{cpu[prompt_len]}``): a declared title or handout row that states a figure names
    the constant it comes from, so that it changes with it."""
    return string.Formatter().vformat(text, (), values)


def imports_ahead(graded: list[str]) -> dict[str, tuple[str, ...]]:
    """Per part of ``graded`` (the parts whose workers a grading starts, in order), the
    libraries its fork server imports ahead once the part's first worker is forked: the
    next part's, where the part allows it (``import_next_beside``)."""
    return {
        part: PARTS[after].preload
        for part, after in pairwise(graded)
        if PARTS[part].import_next_beside and PARTS[after].preload
    }


def parse_parts(spec: str | None) -> list[str]:
    """``"part1,part2"`` -> ``["part1", "part2"]``; ``None`` or ``""`` means every part."""
    if not spec:
        return list(PARTS)
    tags = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in tags if t not in PARTS]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; available: {', '.join(PARTS)}")
    return tags
