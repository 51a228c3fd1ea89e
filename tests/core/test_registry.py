"""grader/core/registry.py: the parts, and which libraries a grading's fork server imports
ahead of the part that needs them."""

from __future__ import annotations

import dataclasses

import pytest

from grader.core.registry import PARTS, imports_ahead, parse_parts


def test_the_next_parts_libraries_are_imported_only_beside_a_part_that_allows_it() -> None:
    """Part 1's workers are small: torch is imported while they run. Later parts' workers
    set the grading's peak memory, and their server imports nothing beside them."""
    allowed = [p for p in PARTS if PARTS[p].import_next_beside]
    assert allowed == ["part1"]
    assert imports_ahead(list(PARTS)) == {"part1": PARTS["part2"].preload}
    assert imports_ahead(["part1", "part4"]) == {"part1": PARTS["part4"].preload}
    assert imports_ahead(["part2", "part3", "part4"]) == {}
    assert imports_ahead(["part1"]) == {}  # nothing follows
    assert imports_ahead([]) == {}


def test_a_next_part_that_preloads_nothing_is_not_asked_for(monkeypatch) -> None:
    monkeypatch.setitem(PARTS, "part2", dataclasses.replace(PARTS["part2"], preload=()))
    assert imports_ahead(["part1", "part2"]) == {}


def test_parts_are_parsed_in_the_given_order_and_unknown_ones_named() -> None:
    assert parse_parts(None) == parse_parts("") == list(PARTS)
    assert parse_parts("part3, part1") == ["part3", "part1"]
    with pytest.raises(ValueError, match="part9"):
        parse_parts("part1,part9")
