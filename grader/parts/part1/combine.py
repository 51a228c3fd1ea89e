"""Combinations of Part 1's known mistakes, for the case builder (TA only).

Students make several of the known mistakes at once (a parameter count with MHA-sized
K and V, no output head and a two-matrix FFN). For each case, the builder takes the
mistakes that change its value, applies every compatible combination of their edits
(edits whose ``old`` texts do not overlap in the reference; two to ``MAX_PARTS`` at a
time) to the reference's source, and stores each combination's value unless a smaller
set already gives it (:func:`keep`). A new mistake in the library is combined with the
others by the next ``regen``, with no code of its own.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from grader.judging.base import same_value, values_match
from grader.parts.part1.causes import combination

#: The most single mistakes in one combination: students seldom make more at once, and
#: the number of combinations grows fast beyond it.
MAX_PARTS = 4

Edits = tuple[tuple[str, str], ...]


class Combiner:
    """Modules of the reference with several mutants' edits applied, made once each."""

    def __init__(self, source: str, edits: Mapping[str, Edits]):
        self.source = source
        self.edits = dict(edits)
        self.spans = {name: self._spans(e) for name, e in self.edits.items()}
        self.modules: dict[frozenset[str], ModuleType | None] = {}

    def _spans(self, edits: Edits) -> list[range]:
        return [range(i, i + len(old)) for old, _ in edits if (i := self.source.find(old)) >= 0]

    def compatible(self, names: Sequence[str]) -> bool:
        """Whether the edits of ``names`` touch no common text of the reference."""
        spans = [(n, s) for n in names for s in self.spans[n]]
        return not any(
            a != b and sa.start < sb.stop and sb.start < sa.stop
            for (a, sa), (b, sb) in itertools.combinations(spans, 2)
        )

    def module(self, names: Sequence[str]) -> ModuleType | None:
        """The reference with every edit of ``names`` applied (None where they clash)."""
        key = frozenset(names)
        if key not in self.modules:
            self.modules[key] = self._build(sorted(key)) if self.compatible(names) else None
        return self.modules[key]

    def _build(self, names: list[str]) -> ModuleType | None:
        text = self.source
        for old, new in (e for n in names for e in self.edits[n]):
            if text.count(old) != 1:
                return None
            text = text.replace(old, new)
        name = f"_part1_combined_{'_'.join(names)}"
        module = ModuleType(name)
        sys.modules[name] = module  # dataclasses look their module up while it runs
        try:
            exec(compile(text, f"<{combination(names)}>", "exec"), module.__dict__)
        finally:
            sys.modules.pop(name, None)
        return module


def explained(value: Any, known: Mapping[str, Any], expected: Any, rel_tol: float) -> bool:
    """Whether ``value`` adds nothing: it is the expected value or one already stored (for
    a table: in every entry, each entry being the expected one or a stored one's)."""
    if not isinstance(value, dict):
        return same_value(value, expected, rel_tol) or any(
            same_value(value, v, rel_tol) for v in known.values()
        )
    if not isinstance(expected, dict) or value.keys() != expected.keys():
        return False
    return all(
        values_match(v, expected[k], rel_tol)
        or any(
            isinstance(o, dict) and k in o and values_match(v, o[k], rel_tol)
            for o in known.values()
        )
        for k, v in value.items()
    )


def combinations(names: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Every set of two to ``MAX_PARTS`` of ``names``, smaller sets first."""
    for size in range(2, min(MAX_PARTS, len(names)) + 1):
        yield from itertools.combinations(names, size)


def combined_mistakes(
    singles: Mapping[str, Any],
    expected: Any,
    value_of: Callable[[ModuleType], Any],
    combiner: Combiner,
    rel_tol: float,
) -> dict[str, Any]:
    """The values of the combinations of ``singles`` (the mistakes that change this
    case's value, by name) that no smaller set gives: smaller sets first, so a value
    already explained keeps its smaller explanation; a set of the same size giving the
    same value is kept beside it (both explain it equally)."""
    stored: dict[str, Any] = {}
    names = [n for n in singles if n in combiner.edits]
    for size_group in _by_size(combinations(names)):
        known = {**singles, **stored}
        found = {}
        for parts in size_group:
            module = combiner.module(parts)
            if module is None:
                continue
            try:
                value = value_of(module)
            except Exception:
                continue
            if not explained(value, known, expected, rel_tol):
                found[combination(parts)] = value
        stored.update(found)
    return stored


def _by_size(groups: Iterator[tuple[str, ...]]) -> Iterator[list[tuple[str, ...]]]:
    for _, same in itertools.groupby(groups, key=len):
        yield list(same)
