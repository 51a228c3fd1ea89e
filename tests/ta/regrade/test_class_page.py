"""report.html of a class regrade: the census counts the planted mistakes exactly, the
pictures are real PNGs, every row links to its feedback, and the page is self-contained."""

from __future__ import annotations

import base64
import io
import re
from html.parser import HTMLParser

import pytest
from PIL import Image

from grader.ta.regrade.census import census, measures, submission_causes
from grader.ta.regrade.class_page import render
from grader.ta.regrade.outputs import make_row
from tests.ta.regrade.conftest import Regraded

pytestmark = pytest.mark.xdist_group("batch")


class Page(HTMLParser):
    """The parts of report.html the tests read."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.external: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if tag == "img":
            self.images.append(a.get("src") or "")
        if tag == "a" and (a.get("href") or "").startswith("#"):
            self.links.append((a.get("href") or "")[1:])
        for key in ("src", "href"):
            value = a.get(key) or ""
            if value and not value.startswith(("#", "data:")):
                self.external.append(value)


def census_counts(text: str) -> dict[str, int]:
    table = re.search(r'<table id="census">(.*?)</table>', text, re.S)
    assert table, "no census table"
    cell = r'<tr><td><code>([^<]+)</code></td><td>(?:known|isolated)</td><td class="num">(\d+)</td>'
    return {cause: int(n) for cause, n in re.findall(cell, table[1])}


def test_the_census_counts_the_planted_mistakes_exactly(regraded: Regraded) -> None:
    text = (regraded.out / "report.html").read_text()
    planted: dict[str, int] = {}
    for e in regraded.entries:
        if e.kind.startswith("mutant:"):
            planted[e.kind[7:]] = planted.get(e.kind[7:], 0) + 1
    assert census_counts(text) == planted


def test_the_pictures_are_embedded_pngs_and_every_row_links_to_its_feedback(
    regraded: Regraded,
) -> None:
    page = Page((regraded.out / "report.html").read_text())
    assert not page.external  # opens offline: no file or server beside it
    assert page.images
    for src in page.images:
        head, _, data = src.partition(",")
        assert head == "data:image/png;base64"
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.load()
        assert image.width >= 200 and image.height >= 150
    folders = {f"sub-{e.folder}" for e in regraded.entries}
    assert set(page.links) == folders and folders <= page.ids


# ------------------------------------------------------------------ pure parts


def results(*checks: tuple[str, list[str]], bench: dict | None = None) -> dict:
    tests = [
        {"number": n, "name": f"{n} check", "status": "failed", "score": 0, "max_score": 1,
         "output": f"{n} went wrong\n\nYour code printed:\nmy name is Ada",
         "extra_data": {"causes": causes}, "tags": ["part1"]}
        for n, causes in checks
    ]  # fmt: skip
    return {"score": 0, "tests": tests, "extra_data": {"benchmarks": bench or {}}}


def test_a_look_alike_named_only_beside_the_real_cause_is_not_counted() -> None:
    data = results(("1.3", ["gqa"]), ("1.4", ["gqa"]), ("1.5", ["gqa", "tp"]))
    assert submission_causes(data) == {"gqa"}
    both = results(("2.4", ["a", "b"]), ("2.5", ["a", "b"]))  # two mistakes at once
    assert submission_causes(both) == {"a", "b"}
    apart = results(("1.3", ["gqa"]), ("1.5", ["tp"]))
    assert submission_causes(apart) == {"gqa", "tp"}


def test_census_counts_submissions_and_keeps_an_anonymous_example() -> None:
    found = census({
        "s1": results(("1.3", ["gqa"]), ("1.4", ["gqa"])),
        "s2": results(("1.4", ["gqa"])),
        "s3": results(("1.8", ["flops"])),
    })  # fmt: skip
    assert [(c.cause, c.submissions, c.checks) for c in found] == [
        ("gqa", ["s1", "s2"], {"1.3": 1, "1.4": 2}),
        ("flops", ["s3"], {"1.8": 1}),
    ]
    assert "went wrong" in found[0].example and "Ada" not in found[0].example


def test_benchmark_measurements_are_drawn_with_their_thresholds() -> None:
    criterion = {"label": "speedup", "ratio": {"median": 2.0}, "limit": 3.0, "at_least": True}
    bench = {"2.11": {"check": "2.11", "criteria": [criterion]}}
    data = {f"s{i}": results(("1.3", []), bench=bench) for i in range(3)}
    found = measures(data)
    assert [(m.key, m.limit, m.at_least, m.values) for m in found] == [
        ("2.11 speedup", 3.0, True, (2.0, 2.0, 2.0))
    ]
    rows = [make_row(k, [], d, "graded") for k, d in data.items()]
    page = Page(render(rows, data, "t"))
    assert len(page.images) == 2  # the part histogram and the benchmark distributions


def test_the_feedback_is_html_with_the_students_text_escaped_once() -> None:
    from grader.core.feedback import markdown_results
    from grader.core.results import GradingResults, TestResult

    raised = "case 1: forward raised NameError: <module> [8, 9, 10, 11, 12, 13]"
    test = TestResult("2.2 logits", 0, 4, "failed", "2.2", raised, ["part2"])
    data = markdown_results(GradingResults(tests=[test], output="a <b> c")).to_gradescope()
    data["tests"][0]["extra_data"]["causes"] = ["cause_x"]
    page = render([make_row("submission_1", [], data, "graded")], {"submission_1": data}, "t")
    assert "&amp;lt;" not in page and "&amp;gt;" not in page and "**" not in page
    assert "\\[" not in page and "<table>" in page and "&lt;module&gt;" in page
    assert "<pre>a &lt;b&gt; c</pre>" in page


def test_the_page_states_the_class_score_and_total_as_the_summary_does() -> None:
    """report.html says the class's mean/median/min/max, the bonus apart and with it, as
    summary.md does (one rule: grader.core.score)."""
    from grader.ta.regrade.outputs import Row

    rows = [
        Row("s1", [], "graded", {"part1": 20.0}, total=84.0, max_score=100.0, bonus=4.0),
        Row("s2", [], "graded", {"part1": 10.0}, total=40.0, max_score=100.0),
    ]
    page = render(rows, {}, "t")
    assert "Score out of 100, the bonus apart: mean 60.00, median 60, min 40, max 80." in page
    assert "what Gradescope records): mean 62.00, median 62, min 40, max 84." in page
