"""Standard mistakes graded end to end: the results file Gradescope reads is valid, speaks
Markdown, names the cause with expected and got, never inlines a long array, and says
nothing about hidden cases but the score."""

from __future__ import annotations

import re
import shutil

import pytest

from grader.core.feedback import HIDDEN_NOTE, MOST_VALUES, escape
from grader.core.results import validate_results
from grader.ta.mutants import load_mutants
from tests.conftest import PART2_LIMITS, Graded, run_grade

#: One test worker runs the module, so each mistake is graded once (the module's fixture),
#: not once on every worker that runs one of its tests.
pytestmark = pytest.mark.xdist_group("markdown_feedback")

#: (part, mutant, a check whose feedback must hold an expected/got table)
MISTAKES = [
    ("part1", "mha_kv_cache", "1.3"),
    ("part2", "positions_not_offset", "2.4"),
    ("part3", "rope_from_zero", "3.3"),
]
LONG_ARRAY = re.compile(r"\[(?:[^\],]*,){%d,}[^\]]*\]" % (MOST_VALUES + 1))  # noqa: UP031


@pytest.fixture(scope="module", params=MISTAKES, ids=[m[1] for m in MISTAKES])
def graded_mistake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    part, name, table_check = request.param
    mutant = next(m for m in load_mutants(part) if m.name == name)
    root = mutant.materialise()
    try:
        out = tmp_path_factory.mktemp(name)
        graded = run_grade(
            root, out, parts=[part], device="cpu", limits=PART2_LIMITS,
            skip_tags=frozenset({"benchmark"}),
        )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return mutant, table_check, graded


def md_tests(graded: Graded) -> dict[str, dict]:
    return {t["number"]: t for t in graded.file["tests"]}


def test_the_file_is_valid_markdown_feedback(graded_mistake) -> None:
    _, _, graded = graded_mistake
    validate_results(graded.file)
    assert graded.file["output_format"] == "md"
    assert all(t.get("output_format") == "md" for t in graded.file["tests"])
    assert graded.file["score"] < sum(t["max_score"] for t in graded.file["tests"])


def test_the_named_cause_is_shown_once_in_its_own_line(graded_mistake) -> None:
    mutant, _, graded = graded_mistake
    md = md_tests(graded)
    named = [
        t["number"] for t in graded.data["tests"]
        if "hidden" not in t["tags"] and mutant.name in t.get("extra_data", {}).get("causes", [])
    ]  # fmt: skip
    assert named, "the mistake was named by no public check"
    for number in named:
        text = md[number]["output"]
        assert text.startswith("**Failed:"), text
        assert "**Likely cause" in text and escape(mutant.diagnosis) in text, text
        assert text.count(escape(mutant.diagnosis)) == 1, text
        assert "**Try:** fix the likely cause above" in text


def test_expected_and_got_are_a_table(graded_mistake) -> None:
    _, check, graded = graded_mistake
    assert "| case | expected | got |" in md_tests(graded)[check]["output"]


def test_no_long_array_is_inlined(graded_mistake) -> None:
    _, _, graded = graded_mistake
    texts = [graded.file["output"], *(t.get("output", "") for t in graded.file["tests"])]
    assert not [m for text in texts for m in LONG_ARRAY.findall(text)]


def test_hidden_checks_show_their_score_and_nothing_else(graded_mistake) -> None:
    _, _, graded = graded_mistake
    hidden = [t for t in graded.file["tests"] if "hidden" in t.get("tags", [])]
    assert hidden
    for t in hidden:
        blocks = t.get("output", "").split("\n\n")
        assert re.fullmatch(r"\*\*(Passed|Failed): [\d.]+ / [\d.]+ points\.\*\*.*", blocks[0])
        assert blocks[1:] in ([], [HIDDEN_NOTE]), t["output"]
