"""Every part is one declaration, ``grader/parts/<tag>/part.toml``, and the code, the
handout and the TA tooling agree with it: a part folder without one, a check coded but not
declared (or declared with other points, flags or title), a missing builder, schema,
mutant library, mutation target, calibration baseline or benchmark profile, and a handout
table or part total that differs from the declared checks each fail here, named."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from grader.core.points import bonus_total, part_total
from grader.core.registry import PARTS, CheckDeclaration, Part, PartTooling, load_parts
from grader.ta.handout import HANDOUT, stale_tables, with_tables
from tests.conftest import ROOT
from tests.part_wiring import Places, wiring_problems

PARTS_DIR = ROOT / "grader" / "parts"


def part_folders(root: Path) -> list[str]:
    """The packages under ``root`` (each is a part)."""
    return sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())


def test_every_part_folder_is_declared() -> None:
    assert part_folders(PARTS_DIR) == sorted(PARTS)


def test_a_folder_without_a_declaration_is_not_a_part(tmp_path: Path) -> None:
    shutil.copytree(PARTS_DIR, tmp_path / "parts", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "parts" / "part9").mkdir()
    (tmp_path / "parts" / "part9" / "__init__.py").write_text("")
    (tmp_path / "parts" / "part9" / "checks.py").write_text("")
    assert "part9" in part_folders(tmp_path / "parts")
    assert "part9" not in load_parts(tmp_path / "parts")  # so the test above fails


@pytest.mark.parametrize("tag", list(PARTS))
def test_every_part_is_wired_everywhere(tag: str) -> None:
    assert wiring_problems(PARTS[tag]) == []


def test_a_half_wired_fifth_part_is_named() -> None:
    """A fifth part declared with one check and nothing else: each missing piece named."""
    part = Part(
        "part9",
        "Paged attention",
        "paged_attention.py",
        checks=(CheckDeclaration("9.1", "pages", "pages", points=2, hidden=True),),
        ta=PartTooling(regen_order=5, mutation_timeout_s=0),
    )
    problems = "\n".join(wiring_problems(part, Places(ROOT)))
    for expected in (
        "solution/paged_attention.py is missing",
        "grader/parts/part9/adapter.py is missing",
        "grader.parts.part9.checks cannot be imported",
        "check 9.1 is declared but grader.parts.part9.checks has no such check",
        "hidden check 9.1 names no public counterpart",
        "no builder for part9",
        "grader/core/schemas/part9_cases.schema.json is missing",
        "grader/ta/mutants/part9.toml is missing",
        "declares no mutation targets",
        "tests/parts/part9/test_checks.py is missing",
    ):
        assert expected in problems


def test_a_check_whose_code_disagrees_with_its_row_is_named() -> None:
    part = PARTS["part2"]
    rows = list(part.checks)
    rows[8] = CheckDeclaration(
        rows[8].number, "another title", rows[8].handout, points=5, partial=True
    )  # 2.9: other points, partial, not timed
    problems = wiring_problems(Part(**{**vars(part), "checks": tuple(rows)}))
    assert "check 2.9: declared points = 5.0, its code says 3.0" in problems
    assert "check 2.9: declared timed = False, its code says True" in problems
    assert "check 2.9: declared partial = True, its code says False" in problems
    assert any(p.startswith("check 2.9: its title on the page is") for p in problems)


def test_a_title_that_states_a_size_follows_its_constant() -> None:
    from grader.parts.part2 import cases
    from tests.part_wiring import coded_checks

    title = coded_checks(PARTS["part2"].checks_module)["2.1"].__doc__
    config = cases.PUBLIC_MODEL["config"]
    assert f"DecoderOnlyTransformer({config['vocab_size']}, {config['d_model']}," in title
    assert "{" not in title


def test_the_handout_tables_are_the_declared_checks() -> None:
    assert stale_tables() == []


def test_a_reweighted_check_changes_its_handout_row() -> None:
    text = HANDOUT.read_text()
    part = PARTS["part2"]
    heavier = tuple(
        CheckDeclaration(**{**vars(c), "points": 7}) if c.number == "2.4" else c
        for c in part.checks
    )
    from grader.ta import handout

    original = handout.PARTS["part2"]
    handout.PARTS["part2"] = Part(**{**vars(part), "checks": heavier})
    try:
        fresh = with_tables(text)
    finally:
        handout.PARTS["part2"] = original
    assert "| 2.4 | 7 |" in fresh and "| 2.4 | 4 |" in text


def test_every_part_total_in_the_handout_and_readme_is_the_declared_one() -> None:
    handout = HANDOUT.read_text()
    readme = (ROOT / "README.md").read_text()
    for tag, part in PARTS.items():
        total, bonus = f"{part_total(tag):g} points", bonus_total(tag)
        heading = re.search(rf"^## Part {part.number} — .*\(([^)]*)\)$", handout, re.M)
        assert heading, f"the handout has no heading for Part {part.number}"
        assert heading.group(1) == total + (f" + {bonus:g} bonus" if bonus else "")
        said = re.search(rf"\*\*Part {part.number}\*\*.*?\(`[^`]+`.*?(\d+ points)", readme, re.S)
        assert said and said.group(1) == total, f"README.md's total for Part {part.number}"
