"""The submissions a verdict-stability run grades, and what each must do.

``benchmarks/verdict_stability.py`` grades the reference, the disguised cache-free design,
the partial caches of ``tests/grading/test_partial_caches.py`` and the mutant library's
correct variants; this module builds them (in a scratch folder or the mutant library's
temporary copies) and says which benchmark checks each is judged on and which way.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from grader.core.paths import SOLUTION
from grader.ta.calibrate import BENCHMARK_PARTS, cache_free_submission, closer_designs
from grader.ta.mutants import Mutant, load_mutants, materialise_all

CHECKS = ("2.11", "3.11", "4.6")
CHECK_OF_PART = {"part2": "2.11", "part3": "3.11", "part4": "4.6"}


@dataclass(frozen=True)
class Entry:
    """A submission of a stability run: what is graded and what it must do."""

    path: Path
    parts: tuple[str, ...] = ()  # the parts graded; () = every part
    expect_pass: bool = False  # pass every judged check (the reference) or fail every one

    @property
    def checks(self) -> tuple[str, ...]:
        """The benchmark checks it is judged on: its parts' (every one by default)."""
        return tuple(CHECK_OF_PART[p] for p in self.parts) if self.parts else CHECKS


def as_entry(value: Entry | Path, name: str) -> Entry:
    """A plain path is the reference (named so) or a submission that must fail."""
    return value if isinstance(value, Entry) else Entry(value, expect_pass=name == "reference")


#: The mutant library's partial caches (mistakes that keep a cache but do part of the work
#: again), graded beside the designs of ``tests/grading/test_partial_caches.py``.
LIBRARY_PARTIALS = {"part3": ("values_reprojected_every_layer", "keys_reprojected_one_layer")}


def partial_designs(parts: tuple[str, ...] = BENCHMARK_PARTS) -> dict[str, list[Mutant]]:
    """The partial caches of ``tests/grading/test_partial_caches.py`` and
    :data:`LIBRARY_PARTIALS` as mutants, by part (of ``parts``)."""
    from tests.grading.test_partial_caches import DESIGNS

    by_part: dict[str, list[Mutant]] = {}
    for name, (file, part, edits, *_) in DESIGNS.items():
        by_part.setdefault(part, []).append(Mutant(name, part, file, tuple(edits)))
    for part, names in LIBRARY_PARTIALS.items():
        by_part.setdefault(part, []).extend(m for m in load_mutants(part) if m.name in names)
    return {p: found for p, found in by_part.items() if p in parts}


def together(by_part: dict[str, list[Mutant]], prefix: str) -> list[tuple[str, Path, tuple]]:
    """The k-th rewrite of every part in one temporary copy of the solution (the parts are
    graded apart, so they do not meet): its label, its folder and the parts it changes."""
    found = []
    for k in range(max((len(v) for v in by_part.values()), default=0)):
        chosen = [v[k] for v in by_part.values() if k < len(v)]
        label = " + ".join(m.name for m in chosen)
        parts = tuple(sorted({m.part for m in chosen}))
        found.append((label, materialise_all(chosen, prefix=prefix), parts))
    return found


def partial_cache_entries(parts: tuple[str, ...] = BENCHMARK_PARTS) -> dict[str, Entry]:
    """The partial caches, each judged on its own part only (the caller removes them)."""
    return {
        f"partial: {label}": Entry(path, found)
        for label, path, found in together(partial_designs(parts), "partial-")
    }


def variant_entries(parts: tuple[str, ...] = BENCHMARK_PARTS) -> dict[str, Entry]:
    """The mutant library's correct rewrites of the benchmark parts (of ``parts``): each
    must keep its parts' benchmark points (the caller removes them)."""
    by_part = {p: load_mutants(p, variants=True) for p in parts}
    return {
        f"variant: {label}": Entry(path, parts, expect_pass=True)
        for label, path, parts in together(by_part, "variant-")
    }


def submissions_of(args: argparse.Namespace) -> dict[str, Entry]:
    """The submissions the command line asks for, the reference first; with ``--parts``,
    each graded and judged on those parts alone."""
    chosen = tuple(p for p in BENCHMARK_PARTS if p in (getattr(args, "parts", "") or ""))
    parts, graded = chosen or tuple(BENCHMARK_PARTS), chosen
    entries = {
        "reference": Entry(SOLUTION, graded, expect_pass=True),
        "cache-free (disguised)": Entry(cache_free_submission(list(parts)), graded),
    }
    if args.extra_baselines:
        entries["cache-free (closer designs)"] = Entry(
            cache_free_submission(list(parts), closer_designs(list(parts))), graded
        )
    if args.partial_caches:
        entries |= partial_cache_entries(parts)
    if args.variants:
        entries |= variant_entries(parts)
    return entries
