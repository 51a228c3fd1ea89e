"""Every known Part 1 mistake is caught (loses points) and named in the feedback."""

from __future__ import annotations

import pytest

from grader.mutants import load_mutants, run_mutants
from tests.conftest import SOLUTION

MUTANTS = load_mutants("part1")


def test_library_is_not_empty_and_names_are_unique() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) >= 10
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_applies_to_the_solution(mutant) -> None:
    source = (SOLUTION / mutant.file).read_text()
    assert mutant.apply(source) != source


def test_every_mutant_is_caught_and_named() -> None:
    verdicts = run_mutants(["part1"])
    assert len(verdicts) == len(MUTANTS)
    missed = [v.mutant.name for v in verdicts if not v.caught]
    unnamed = [v.mutant.name for v in verdicts if not v.named]
    assert missed == []
    assert unnamed == []
