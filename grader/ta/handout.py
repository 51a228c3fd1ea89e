"""The handout's "How it is graded" tables, written from the parts' declarations.

Each part's section of ``assignment/README.md`` holds a table of its checks: number,
points and what the check asks. They are drawn from the part's table of checks
(``grader/parts/<tag>/part.toml``: ``points``, ``bonus``, ``handout``), whose ``{...}``
fields name the constants a figure comes from (``{cases.WORK_NEW}``: the part's
``cases`` module; ``{cpu[prompt_len]}``: the part's cpu profile in ``thresholds.toml``),
so a reweighted check, a new check or a changed workload changes the handout with it.
``python -m grader regen`` rewrites the tables; ``regen --check`` and the tests fail on a
stale one.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

from grader.core.paths import PROJECT_ROOT
from grader.core.registry import PARTS, CheckDeclaration, Part, fill
from grader.core.thresholds import load_thresholds

HANDOUT = PROJECT_ROOT / "assignment" / "README.md"
HEADING = "### How it is graded"
HEADER = "| check | points | what |\n| --- | --- | --- |\n"
#: A part's section: "## Part 3 — ..." up to the next part's heading.
SECTION = re.compile(r"^## Part (\d+)\b.*?(?=^## Part \d+\b|\Z)", re.M | re.S)
#: The table below the section's heading: its header, then its rows.
TABLE = re.compile(rf"({re.escape(HEADING)}\n\n)(\|[^\n]*\n)+")


def part_values(part: Part) -> dict[str, object]:
    """What a declared text may name: the part's ``cases`` module and its cpu profile."""
    name = f"grader.parts.{part.tag}.cases"
    cases = importlib.import_module(name) if importlib.util.find_spec(name) else None
    return {"cases": cases, "cpu": load_thresholds("cpu").get(part.tag, {})}


def points_cell(check: CheckDeclaration) -> str:
    """ "3", or "4 (bonus)" for extra credit."""
    return f"{check.bonus:g} (bonus)" if check.bonus else f"{check.points:g}"


def table(part: Part) -> str:
    """The part's "How it is graded" table, in Markdown."""
    values = part_values(part)
    rows = [
        f"| {c.number} | {points_cell(c)} | {fill(c.handout, **values)} |\n" for c in part.checks
    ]
    return HEADER + "".join(rows)


def with_tables(text: str) -> str:
    """The handout ``text`` with every part's table drawn from its declaration. A part
    whose section or table is missing is an error: the handout must grade every part."""
    sections = {m.group(1): m for m in SECTION.finditer(text)}
    out, at = [], 0
    for part in PARTS.values():
        section = sections.get(str(part.number))
        if section is None:
            raise ValueError(f"the handout has no '## Part {part.number}' section")
        found = TABLE.search(text, section.start(), section.end())
        if found is None:
            raise ValueError(f"Part {part.number}'s section has no '{HEADING}' table")
        out += [text[at : found.start()], found.group(1), table(part)]
        at = found.end()
    return "".join([*out, text[at:]])


def stale_tables(path: Path = HANDOUT) -> list[str]:
    """The parts whose handout table differs from their declaration ([] when current)."""
    text = path.read_text()
    fresh = with_tables(text)
    if fresh == text:
        return []
    now = {m.group(1): m.group() for m in SECTION.finditer(text)}
    new = {m.group(1): m.group() for m in SECTION.finditer(fresh)}
    return [
        tag for tag, part in PARTS.items() if now.get(str(part.number)) != new.get(str(part.number))
    ]


def write_tables(path: Path = HANDOUT) -> bool:
    """Rewrite the handout's tables from the declarations; whether anything changed."""
    text = path.read_text()
    fresh = with_tables(text)
    if fresh != text:
        path.write_text(fresh)
    return fresh != text
