"""A grading with a known mistake in every part, then every sentence its checks wrote
reworded: the layout of each check's feedback (its blocks' kinds, every table's header and
shape) is the same in the Markdown Gradescope shows, the terminal's text and the HTML
reports. The feedback is laid out from the items the checks handed over, never from their
wording: a view that read a table back from a sentence would lose it here."""

from __future__ import annotations

import codecs
import re
import shutil
from dataclasses import replace

import pytest

from grader.core.document import to_html, to_markdown, to_text
from grader.core.feedback import FEEDBACK, blocks_of, feedback_blocks
from grader.core.feedback_items import ITEMS, Case, Cause, Feedback, LogitCase, Measurement
from grader.core.results import TestResult
from grader.ta.mutants import load_mutants, materialise_all
from tests.conftest import PART2_LIMITS, Graded, run_grade

pytestmark = pytest.mark.xdist_group("feedback_layout")

#: One mistake per part, each failing public checks with cases and a named cause.
MISTAKES = {
    "part1": "mha_kv_cache",
    "part2": "positions_not_offset",
    "part3": "rope_from_zero",
    "part4": "cache_never_passed_back",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Graded:
    mutants = [
        next(m for m in load_mutants(part) if m.name == name) for part, name in MISTAKES.items()
    ]
    root = materialise_all(mutants)
    try:
        return run_grade(
            root, tmp_path_factory.mktemp("every_part"), parts=list(MISTAKES), device="cpu",
            limits=PART2_LIMITS, skip_tags=frozenset({"benchmark"}),
        )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


def reword(text: str) -> str:
    """Every word of ``text`` changed, letter by letter (ROT13): no phrase survives, and
    every line keeps its length, so a terminal's table keeps its width."""
    return codecs.encode(text, "rot13")


def reworded_items(fb: Feedback) -> Feedback:
    """``fb`` with every text it holds reworded: cases, causes, lines, tables, counts."""

    def case(c: Case | LogitCase) -> Case | LogitCase:
        if isinstance(c, LogitCase):
            return replace(c, label=reword(c.label), where=reword(c.where))
        return Case(reword(c.label), reword(c.got), reword(c.how), reword(c.remark))

    return replace(
        fb,
        count=reword(fb.count),
        causes=[Cause(c.id, reword(c.text), reword(c.evidence)) for c in fb.causes],
        lead=[reword(x) for x in fb.lead],
        cases=[case(c) for c in fb.cases],
        notes=[reword(x) for x in fb.notes],
        tables=[Measurement(m.header, [[reword(x) for x in r] for r in m.rows]) for m in fb.tables],
        printed=reword(fb.printed),
    )


def reworded(test: TestResult) -> TestResult:
    """The check as if every sentence it wrote were worded otherwise: its items and its
    plain text alike."""
    extra = dict(test.extra_data)
    fb = Feedback.from_json(extra.get(ITEMS))
    if fb is not None:
        extra[ITEMS] = reworded_items(fb).to_json()
    return replace(test, output=reword(test.output), extra_data=extra)


def shape(blocks: list[dict]) -> list[tuple]:
    """The layout of ``blocks``: each block's kind, and a table's header and row lengths,
    a paragraph's line count, a list's length, the advice's kind."""
    out = []
    for b in blocks:
        if b["kind"] == "table":
            out.append(("table", tuple(b["header"]), tuple(len(r) for r in b["rows"])))
        elif b["kind"] == "paragraph":
            out.append(("paragraph", len(b["lines"])))
        elif b["kind"] == "list":
            out.append(("list", len(b["items"])))
        else:
            out.append((b["kind"], b.get("what")))
    return out


def tags(html: str) -> list[str]:
    return re.findall(r"</?\w+", html)


def rendered(blocks: list[dict]) -> dict[str, object]:
    """The three renderings' layouts: the tags Gradescope's Markdown draws, the HTML
    report's tags, and the terminal's text with every letter masked."""
    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark").enable("table").render(to_markdown(blocks))
    return {
        "markdown": tags(md),
        "html": tags(to_html(blocks)),
        "text": re.sub(r"[A-Za-z]", "x", to_text(blocks)),
    }


def test_rewording_every_sentence_changes_no_layout(graded: Graded) -> None:
    benchmarks = graded.results.extra_data.get("benchmarks") or {}
    device = str(graded.results.extra_data.get("device", ""))
    compared = 0
    for test in graded.results.tests:
        before = feedback_blocks(test, benchmarks.get(test.number), device)
        after = feedback_blocks(reworded(test), benchmarks.get(test.number), device)
        assert shape(after) == shape(before), test.number
        assert rendered(after) == rendered(before), test.number
        if test.status == "failed" and "hidden" not in test.tags:
            assert to_markdown(after) != to_markdown(before), test.number  # it was reworded
            compared += 1
    assert compared >= 8


def test_each_part_shows_its_failing_cases_as_a_table_and_names_its_mistake(
    graded: Graded,
) -> None:
    """What the rewording test keeps: every part has a table of cases, and its mistake is
    named as a likely cause (laid out as one), so an unchanged layout is not an empty one."""
    for part, name in MISTAKES.items():
        public = [t for t in graded.results.tests if t.part == part and "hidden" not in t.tags]
        blocks = {t.number: feedback_blocks(t, None, "cpu") for t in public}
        with_table = [n for n, b in blocks.items() if any(x[0] == "table" for x in shape(b))]
        assert with_table, part
        named = [t.number for t in public if name in t.extra_data.get("causes", [])]
        assert named, (part, name)
        for number in named:
            texts = [s[1] for b in blocks[number] if b["kind"] == "paragraph"
                     for line in b["lines"] for s in line]  # fmt: skip
            assert "Likely cause:" in texts or "Likely causes:" in texts, number


def test_the_file_keeps_the_blocks_the_live_grading_laid_out(graded: Graded) -> None:
    """Read back from results.json (``show``, the class report), each check's blocks are
    those of the live grading; the items themselves stay out of the file."""
    benchmarks = graded.results.extra_data.get("benchmarks") or {}
    by_number = {t["number"]: t for t in graded.file["tests"]}
    for test in graded.results.tests:
        stored = by_number[test.number]
        assert ITEMS not in stored.get("extra_data", {})
        live = feedback_blocks(test, benchmarks.get(test.number), "cpu")
        assert stored["extra_data"][FEEDBACK] == live, test.number
        assert blocks_of(stored, graded.file.get("extra_data", {})) == live
