"""benchmarks/stability_submissions.py: the submissions a stability run grades."""

from __future__ import annotations

import shutil
from types import ModuleType

import pytest

from grader.ta.mutants import load_mutants
from grader.ta.regen import import_path
from tests.conftest import ROOT, SOLUTION


@pytest.fixture(scope="module")
def submissions() -> ModuleType:
    return import_path(ROOT / "benchmarks" / "stability_submissions.py", "stability_subs_test")


def test_the_partial_cache_and_variant_submissions_are_built(submissions: ModuleType) -> None:
    """Every design of the tests becomes part of a submission, on the parts it edits."""
    from tests.grading.test_partial_caches import DESIGNS

    entries = submissions.partial_cache_entries()
    variants = submissions.variant_entries()
    made = [*entries.values(), *variants.values()]
    try:
        named = [n for label in entries for n in label.removeprefix("partial: ").split(" + ")]
        library = {n: (None, p) for p, names in submissions.LIBRARY_PARTIALS.items() for n in names}
        assert sorted(named) == sorted([*DESIGNS, *library])
        for n in library:  # each still a mistake of the library
            assert any(m.name == n for m in load_mutants(library[n][1]))
        designs = {**DESIGNS, **library}
        for label, entry in entries.items():
            parts = {designs[n][1] for n in label.removeprefix("partial: ").split(" + ")}
            assert set(entry.parts) == parts and not entry.expect_pass
            assert (entry.path / "transformer_skeleton.py").read_text() != (
                SOLUTION / "transformer_skeleton.py"
            ).read_text() or "part2" not in parts
        assert all(e.expect_pass for e in variants.values())
        assert sum(len(label.split(" + ")) for label in variants) == sum(
            len(load_mutants(p, variants=True)) for p in submissions.BENCHMARK_PARTS
        )
    finally:
        for e in made:
            shutil.rmtree(e.path, ignore_errors=True)


def test_parts_narrow_every_submission_to_those_parts(submissions: ModuleType) -> None:
    """``--parts part3``: the reference, the cache-free design, the partial caches and the
    variants are each graded and judged on Part 3 alone."""
    import argparse

    args = argparse.Namespace(
        parts="part3", extra_baselines=False, partial_caches=True, variants=True
    )
    entries = submissions.submissions_of(args)
    try:
        assert {e.parts for e in entries.values()} == {("part3",)}
        assert {e.checks for e in entries.values()} == {("3.11",)}
        labels = " ".join(entries)
        assert "values_reprojected_every_layer" in labels and "cat_cache_report_style" in labels
    finally:
        for e in entries.values():
            if e.path != SOLUTION:
                shutil.rmtree(e.path, ignore_errors=True)
