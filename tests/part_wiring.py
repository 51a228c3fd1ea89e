"""What makes a part whole: every place the grader, the self-check and the TA tooling
look for it, checked against its declaration (``grader/parts/<tag>/part.toml``).

:func:`wiring_problems` lists, for one part, each thing missing or disagreeing, in words
that say where to look; ``tests/test_parts.py`` runs it on every part folder and on a part
half-wired on purpose."""

from __future__ import annotations

import ast
import importlib
import inspect
import tomllib
import unittest
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from grader.core.registry import CheckDeclaration, Part
from grader.judging.base import declared_title

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Places:
    """Where a part's pieces live (the project's folders by default)."""

    root: Path = ROOT

    @property
    def grader(self) -> Path:
        return self.root / "grader"


def coded_checks(module_name: str) -> dict[str, Callable]:
    """Every graded check method of a checks module, by number."""
    module = importlib.import_module(module_name)
    found = {}
    for obj in vars(module).values():
        if isinstance(obj, type) and issubclass(obj, unittest.TestCase):
            for name in dir(obj):
                method = getattr(obj, name)
                if hasattr(method, "__number__"):
                    found[method.__number__] = method
    return found


def flag_problems(declared: CheckDeclaration, method: Callable) -> Iterator[str]:
    """How a check's code disagrees with its declared row."""
    tags = set(getattr(method, "__tags__", ()))
    inner = inspect.unwrap(method)
    coded = {
        "points": float(method.__weight__),
        "hidden": "hidden" in tags,
        "bonus": "bonus" in tags,
        "benchmark": "benchmark" in tags,
        "timed": bool(getattr(method, "__yardstick__", False)),
        "partial": "set_score" in inspect.signature(inner).parameters,
    }
    wanted = {
        "points": 0.0 if declared.bonus else float(declared.points),
        "hidden": declared.hidden,
        "bonus": bool(declared.bonus),
        "benchmark": declared.benchmark,
        "timed": declared.timed,
        "partial": declared.partial or bool(declared.bonus),
    }
    for key, value in wanted.items():
        if coded[key] != value:
            yield f"check {declared.number}: declared {key} = {value}, its code says {coded[key]}"
    if inspect.unwrap(method).__doc__:
        yield f"check {declared.number}: its code writes a title too (the declaration holds it)"
    if method.__doc__ != f"{declared.number} {declared_title(declared)}":
        yield f"check {declared.number}: its title on the page is {method.__doc__!r}"


def table_problems(part: Part, coded: dict[str, Callable]) -> Iterator[str]:
    """The declared table against the checks module."""
    declared = [c.number for c in part.checks]
    expected = [f"{part.number}.{k}" for k in range(1, len(declared) + 1)]
    if declared != expected:
        yield f"checks are numbered {declared}, not {expected}"
    for number in sorted(set(coded) - set(declared)):
        yield f"check {number} is coded in {part.checks_module} but not declared"
    public = {c.number for c in part.checks if not c.hidden}
    for check in part.checks:
        if check.hidden and not check.public_counterparts:
            yield f"hidden check {check.number} names no public counterpart for the self-check"
        for other in check.public_counterparts:
            if other not in public:
                yield f"check {check.number}'s counterpart {other} is not a public check of it"
        if check.number not in coded:
            yield f"check {check.number} is declared but {part.checks_module} has no such check"
        else:
            yield from flag_problems(check, coded[check.number])


def defined_names(source: Path) -> set[str]:
    """Functions and methods (``Class.method``) defined in a file."""
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{f.name}" for f in node.body if isinstance(f, ast.FunctionDef)}
    return names


def tooling_problems(part: Part, places: Places) -> Iterator[str]:
    """The TA tooling's pieces of a part: builder, schema, mutant library, mutation
    targets, calibration baselines and benchmark profile, its tests."""
    from grader.ta import regen

    folder = places.grader / "parts" / part.tag
    if part.tag not in regen.BUILDERS:
        yield f"grader/ta/regen.py has no builder for {part.tag} (BUILDERS)"
    if not (folder / "build.py").is_file():
        yield f"{folder.relative_to(places.root)}/build.py is missing"
    schema = places.grader / "core" / "schemas" / f"{part.tag}_cases.schema.json"
    if not schema.is_file():
        yield f"{schema.relative_to(places.root)} is missing"
    library = places.grader / "ta" / "mutants" / f"{part.tag}.toml"
    mutants = tomllib.loads(library.read_text()) if library.is_file() else {}
    if not mutants:
        yield f"{library.relative_to(places.root)} is missing or empty (the mutant library)"
    if part.ta.mutation_timeout_s <= 0 or not part.ta.mutation_targets:
        yield "[ta] declares no mutation targets or timeout"
    for file, names in part.ta.mutation_targets.items():
        source = places.root / "solution" / file
        missing = set(names) - (defined_names(source) if source.is_file() else set())
        if missing:
            yield f"mutation targets not defined in solution/{file}: {sorted(missing)}"
    benchmark = any(c.benchmark for c in part.checks)
    thresholds = tomllib.loads((places.grader / "core" / "thresholds.toml").read_text())
    profiled = [d for d in ("cpu", "cuda") if part.tag in thresholds.get(d, {})]
    if benchmark != (profiled == ["cpu", "cuda"]):
        yield f"a benchmark check needs [cpu.{part.tag}] and [cuda.{part.tag}] (found {profiled})"
    if benchmark != bool(part.ta.cache_free_baseline):
        yield "a benchmark part needs a cache_free_baseline for calibration, and only it"
    names = {m.get("name") for m in mutants.get("mutant", [])} | set(mutants)
    for baseline in filter(None, (part.ta.cache_free_baseline, *part.ta.cache_free_extra)):
        if baseline not in names:
            yield f"the calibration baseline {baseline!r} is not in the mutant library"
    if not (places.root / "tests" / "parts" / part.tag / "test_checks.py").is_file():
        yield f"tests/parts/{part.tag}/test_checks.py is missing"


def wiring_problems(part: Part, places: Places | None = None) -> list[str]:
    """Everything missing or disagreeing about ``part``, each in a sentence ([]: whole)."""
    places = places or Places()
    folder = places.grader / "parts" / part.tag
    problems = []
    for rel in part.edited:
        for where in ("solution", "assignment"):
            if not (places.root / where / rel).is_file():
                problems.append(f"{where}/{rel} is missing (the part's files)")
    if not (folder / "adapter.py").is_file():
        problems.append(f"{folder.relative_to(places.root)}/adapter.py is missing (worker side)")
    try:
        coded = coded_checks(part.checks_module)
    except ImportError as exc:
        problems.append(f"{part.checks_module} cannot be imported: {exc}")
        coded = {}
    problems += table_problems(part, coded)
    problems += tooling_problems(part, places)
    return problems
