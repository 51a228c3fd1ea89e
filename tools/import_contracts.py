"""import-linter contracts whose modules are named by a pattern, not listed by hand.

The worker side of every part is ``adapter.py`` and the ``adapter_*.py`` modules beside it
(the files the sandbox copies); import-linter's own wildcards match whole module names
only, so a contract written with them lists every ``adapter_*`` module, and a new one left
off the list is unprotected. These contracts take shell-style patterns within a name
(``grader.parts.*.adapter*``, ``grader.worker.**``), expand them against the import graph
when the contract is checked, and then check exactly what import-linter's ``forbidden``
and ``protected`` contracts check. Registered in ``pyproject.toml`` (``contract_types``).
"""

from __future__ import annotations

import re

from grimp import ImportGraph
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.protected import ProtectedContract
from importlinter.domain import fields
from importlinter.domain.contract import ContractCheck
from importlinter.domain.imports import ModuleExpression


def _pattern(expression: str) -> re.Pattern[str]:
    """A module pattern as a regular expression: ``**`` spans dots, ``*`` and ``?`` stay
    within a name, everything else is literal."""
    pieces = re.split(r"(\*\*|\*|\?)", expression)
    wild = {"**": ".*", "*": "[^.]*", "?": "[^.]"}
    return re.compile("".join(wild.get(p, re.escape(p)) for p in pieces) + r"\Z")


def expand(graph: ImportGraph, expressions: list[str]) -> list[ModuleExpression]:
    """Every module of ``graph`` that one of ``expressions`` matches, as plain names.

    A pattern that matches nothing is an error: a contract over no module keeps itself."""
    found: list[str] = []
    for expression in expressions:
        regex = _pattern(expression)
        matched = sorted(m for m in graph.modules if regex.match(m))
        if not matched:
            raise ValueError(f"the pattern {expression!r} matches no module")
        found += [m for m in matched if m not in found]
    return [ModuleExpression(m) for m in found]


class ForbiddenByPattern(ForbiddenContract):
    """``forbidden``, with ``source_modules`` and ``forbidden_modules`` given as patterns."""

    type_name = "forbidden_by_pattern"
    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        self.source_modules = set(expand(graph, self.source_modules))  # type: ignore[arg-type]
        self.forbidden_modules = set(expand(graph, self.forbidden_modules))  # type: ignore[arg-type]
        return super().check(graph, verbose)


class ProtectedByPattern(ProtectedContract):
    """``protected``, with ``protected_modules`` and ``allowed_importers`` given as patterns;
    ``open_modules`` (exact names) are left out of what the patterns protect."""

    type_name = "protected_by_pattern"
    protected_modules = fields.ListField(subfield=fields.StringField())
    allowed_importers = fields.ListField(subfield=fields.StringField())
    open_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        protected = expand(graph, self.protected_modules)  # type: ignore[arg-type]
        missing = set(self.open_modules) - set(graph.modules)  # type: ignore[arg-type]
        if missing:
            raise ValueError(f"open_modules names no module: {', '.join(sorted(missing))}")
        self.protected_modules = {m for m in protected if m.expression not in self.open_modules}  # type: ignore[operator]
        self.allowed_importers = expand(graph, self.allowed_importers)  # type: ignore[arg-type]
        return super().check(graph, verbose)
