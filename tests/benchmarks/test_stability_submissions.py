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
        assert sorted(named) == sorted(DESIGNS)
        for label, entry in entries.items():
            parts = {DESIGNS[n][1] for n in label.removeprefix("partial: ").split(" + ")}
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
