"""The submissions a verdict-stability run grades, and what each must do.

``benchmarks/verdict_stability.py`` grades the reference, the disguised cache-free design,
the partial caches of ``tests/grading/test_partial_caches.py`` and the mutant library's
correct variants; this module builds them (in a scratch folder or the mutant library's
temporary copies) and says which benchmark checks each is judged on and which way.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

from grader.core.paths import SOLUTION
from grader.ta.calibrate import BENCHMARK_PARTS, cache_free_submission, closer_designs
from grader.ta.mutants import load_mutants, materialise_all

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


def partial_cache_entries(root: Path) -> dict[str, Entry]:
    """The partial caches of the tests, written into ``root``: designs of different parts
    share a submission (the k-th design of each part), each judged on its parts only."""
    from tests.grading.test_partial_caches import DESIGNS

    by_part: dict[str, list[tuple[str, str, list]]] = {}
    for name, (file, part, edits, *_) in DESIGNS.items():
        by_part.setdefault(part, []).append((name, file, edits))
    entries = {}
    for k in range(max(len(v) for v in by_part.values())):
        chosen = {part: designs[k] for part, designs in by_part.items() if k < len(designs)}
        path = root / f"partial-{k}"
        shutil.copytree(SOLUTION, path, ignore=shutil.ignore_patterns("__pycache__", "*.png"))
        for name, file, edits in chosen.values():
            target = path / file
            target.write_text(apply_edits(target.read_text(), edits, name))
        label = " + ".join(name for name, _, _ in chosen.values())
        entries[f"partial: {label}"] = Entry(path, tuple(sorted(chosen)))
    return entries


def apply_edits(text: str, edits: list[tuple[str, str]], name: str) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise ValueError(f"{name}: edit anchor {old!r} must occur exactly once")
        text = text.replace(old, new)
    return text


def variant_entries() -> dict[str, Entry]:
    """The mutant library's correct rewrites of the benchmark parts, the k-th of each part
    in one submission: each must keep its parts' benchmark points."""
    by_part = {p: load_mutants(p, variants=True) for p in BENCHMARK_PARTS}
    by_part = {p: v for p, v in by_part.items() if v}
    entries = {}
    for k in range(max((len(v) for v in by_part.values()), default=0)):
        chosen = [v[k] for v in by_part.values() if k < len(v)]
        path = materialise_all(chosen, prefix="variant-")
        label = " + ".join(m.name for m in chosen)
        entries[f"variant: {label}"] = Entry(
            path, tuple(sorted({m.part for m in chosen})), expect_pass=True
        )
    return entries


def submissions_of(args: argparse.Namespace, scratch: Path) -> dict[str, Entry]:
    """The submissions the command line asks for, the reference first."""
    parts = list(BENCHMARK_PARTS)
    entries = {
        "reference": Entry(SOLUTION, expect_pass=True),
        "cache-free (disguised)": Entry(cache_free_submission(parts)),
    }
    if args.extra_baselines:
        entries["cache-free (closer designs)"] = Entry(
            cache_free_submission(parts, closer_designs(parts))
        )
    if args.partial_caches:
        entries |= partial_cache_entries(scratch)
    if args.variants:
        entries |= variant_entries()
    return entries
