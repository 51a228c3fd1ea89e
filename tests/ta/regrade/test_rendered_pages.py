"""The HTML reports as a browser shows them (headless Chromium, a 1280 px window), built
from gradings the kit really runs: the class report's benchmark charts read their titles
before their numbers, the similarity page's panes open on their highlighted code, the
self-check report shows its parts in order with their curves, and no page makes a TA
scroll sideways. Each measurement is also taken on a page with the defect, to show it
tells the two apart."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import pytest

from grader import cli
from grader.core.figures import pyplot
from grader.grading import selfcheck_page
from grader.ta.regrade import class_page
from grader.ta.regrade.census import measures
from grader.ta.regrade.outputs import make_row
from tests.conftest import ROOT, Graded
from tests.ta.chromium import WIDTH, assert_fits, measure, needs_browser, overflow
from tests.ta.regrade.conftest import Regraded
from tests.ta.similarity_factory import build_similarity_export

pytestmark = [pytest.mark.xdist_group("batch")]  # the regraded export's worker

#: The smallest title a TA reads without leaning in (the issue measured 9 px titles).
MIN_TITLE_PX = 12.0
REFERENCE = ROOT / "grader/gradescope/student/reference_benchmarks.json"


#: The browser tests: skipped, saying what to install, before their gradings are built.
BROWSER = pytest.mark.usefixtures("chromium")


@pytest.fixture(scope="session")
def chromium() -> str:
    return needs_browser()


def class_page_of(*graded: Graded) -> str:
    """report.html of a class of the given gradings (their results files, as a batch
    reads them back)."""
    results = {f"submission_{i}": g.file for i, g in enumerate(graded, 1)}
    rows = [make_row(k, [], d, "graded") for k, d in results.items()]
    return class_page.render(rows, results, "Regrade of a class")


#: The benchmark picture's scale in the page and its text sizes as the TA sees them.
CHART_TEXT = """
const img = document.querySelector('img[alt="benchmark measurements"]');
if (!img) return null;
const scale = img.getBoundingClientRect().width / img.naturalWidth;
return {scale: scale, title: Number(img.dataset.titlePx) * scale,
        tick: Number(img.dataset.tickPx) * scale};
"""


def assert_titles_readable(page: str) -> None:
    shown = measure(page, CHART_TEXT)
    assert shown is not None, "the class report drew no benchmark chart"
    assert shown["title"] >= shown["tick"] and shown["title"] >= MIN_TITLE_PX, shown


@BROWSER
def test_class_page_chart_titles_are_no_smaller_than_their_ticks(
    solution_graded: Graded, blank_graded: Graded, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_titles_readable(class_page_of(solution_graded, blank_graded))

    drawn = class_page.draw_measure

    def old_style(ax: Any, m: Any) -> None:  # the titles the issue found: 8 pt, 10 pt ticks
        drawn(ax, m)
        ax.set_title(m.key, fontsize=7)

    monkeypatch.setattr(class_page, "draw_measure", old_style)
    with pytest.raises(AssertionError):
        assert_titles_readable(class_page_of(solution_graded, blank_graded))


def assert_titles_fit(fig: Any) -> None:
    """Every chart title lies inside the picture and clear of every other title."""
    renderer = fig.canvas.get_renderer()
    boxes = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    pyplot().close(fig)
    assert boxes
    for box in boxes:
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, box
    for k, box in enumerate(boxes):
        assert not any(box.overlaps(other) for other in boxes[k + 1 :]), box


def test_class_page_chart_titles_are_neither_cut_nor_overlapping(
    solution_graded: Graded, blank_graded: Graded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real criteria's titles (3.11's are over 60 characters) at the title size."""
    found = [m for m in measures({"a": solution_graded.file, "b": blank_graded.file}) if m.values]
    assert_titles_fit(class_page.measure_figure(found))
    monkeypatch.setattr(class_page, "TITLE_CHARS", 1000)  # one line each, as before
    with pytest.raises(AssertionError):
        assert_titles_fit(class_page.measure_figure(found))


@BROWSER
def test_class_pages_fit_the_window(
    regraded: Regraded, solution_graded: Graded, blank_graded: Graded
) -> None:
    """The batch's own report.html (20 submissions, their feedback) and a class with
    benchmark charts: no horizontal scroll at 1280 px."""
    assert_fits((regraded.out / "report.html").read_text())
    page = class_page_of(solution_graded, blank_graded)
    assert_fits(page)
    unwrapped = page.replace("white-space: pre-wrap;", "white-space: pre;")  # before the fix
    long_line = "<pre>" + "x" * 400 + "</pre></body>"
    assert overflow(unwrapped.replace("</body>", long_line, 1))["scroll"] > WIDTH


@pytest.fixture(scope="module")
def similarity_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The similarity page of a small export (planted copies, the skeleton, unrelated
    code), and the same export's page with copydetect's whole files (no truncation)."""
    export = tmp_path_factory.mktemp("export")
    build_similarity_export(export, independent=3)
    out = tmp_path_factory.mktemp("similarity")
    assert cli.main(["similarity", str(export), "--out", str(out)]) == 0
    import copydetect

    class Whole(copydetect.CopyDetector):  # the page before each copy was cut
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**{**kwargs, "truncate": False})

    whole = tmp_path_factory.mktemp("similarity-whole")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(copydetect, "CopyDetector", Whole)
        assert cli.main(["similarity", str(export), "--out", str(whole)]) == 0
    return out / "similarity.html", whole / "similarity.html"


#: Every pane's first highlighted region against the pane's visible box, every file's
#: section opened (a closed one opens where it is: its pane is not scrolled either).
PANES = """
document.querySelectorAll('details').forEach(d => { d.open = true; });
return [...document.querySelectorAll('.code pre')].map(pre => {
  const box = pre.getBoundingClientRect();
  const mark = pre.querySelector('[class^="highlight-"]');
  const id = pre.closest('details').id;
  if (!mark) return {id: id, top: null};
  const first = mark.getClientRects()[0];
  return {id: id, top: first.top - box.top, bottom: first.bottom - box.top,
          visible: pre.clientHeight, scrolled: pre.scrollTop};
});
"""


def hidden_panes(page: Path) -> list[dict[str, Any]]:
    """The panes whose first highlighted region needs a scroll inside the pane."""
    panes = measure(page.read_text(), PANES)
    assert panes, "no side-by-side pane on the page"
    return [
        p for p in panes
        if p["top"] is None or p["scrolled"] or p["top"] < 0 or p["bottom"] > p["visible"]
    ]  # fmt: skip


@BROWSER
def test_similarity_highlights_are_on_each_panes_first_screen(similarity_page) -> None:
    page, whole = similarity_page
    assert hidden_panes(page) == []
    assert hidden_panes(whole), "whole files should hide a match below the pane's fold"
    assert_fits(page.read_text())


#: The self-check report's headings and pictures, top to bottom, each picture's coloured
#: pixels (the curves; axes, text and grid are grey).
SELFCHECK = """
const heads = [...document.querySelectorAll('h2')].map(h => ({text: h.textContent,
  top: h.getBoundingClientRect().top}));
const pictures = [...document.querySelectorAll('img')].map(img => {
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let coloured = 0;
  for (let i = 0; i < d.length; i += 4) {
    const hi = Math.max(d[i], d[i + 1], d[i + 2]), lo = Math.min(d[i], d[i + 1], d[i + 2]);
    if (hi - lo > 80) coloured++;
  }
  const r = img.getBoundingClientRect();
  return {alt: img.alt, top: r.top, height: r.height, coloured: coloured};
});
return {heads: heads, pictures: pictures};
"""
#: Coloured pixels a drawn curve leaves at the least (a legend's swatches alone: ~100).
MIN_CURVE_PIXELS = 400


def shown_parts(page: str) -> tuple[list[str], dict[str, int]]:
    """The Part headings in the order a reader meets them, and each picture's coloured
    pixels by its title."""
    found = measure(page, SELFCHECK)
    heads = sorted(found["heads"], key=lambda h: h["top"])
    parts = [h["text"] for h in heads if h["text"].startswith("Part ")]
    for p in found["pictures"]:  # each picture stands under its own heading
        above = [h["text"] for h in heads if h["top"] < p["top"]]
        assert above and above[-1] == p["alt"] and p["height"] > 100, (p, above)
    return parts, {p["alt"]: p["coloured"] for p in found["pictures"]}


def selfcheck_page_of(graded: Graded) -> str:
    return selfcheck_page.render(graded.file, json.loads(REFERENCE.read_text()))


@BROWSER
def test_selfcheck_page_shows_parts_in_order_with_their_curves(
    solution_graded: Graded, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = selfcheck_page_of(solution_graded)
    parts, pictures = shown_parts(page)
    assert [p.split(":")[0] for p in parts] == ["Part 2", "Part 3", "Part 4"]
    curves = [t for t in parts if t.startswith(("Part 3", "Part 4"))]
    assert set(pictures) == set(curves), pictures
    assert min(pictures.values()) >= MIN_CURVE_PIXELS, pictures
    assert_fits(page)

    monkeypatch.setattr(selfcheck_page, "PICTURES", selfcheck_page.PICTURES[::-1])
    reversed_parts, _ = shown_parts(selfcheck_page_of(solution_graded))
    assert [p.split(":")[0] for p in reversed_parts] == ["Part 4", "Part 3", "Part 2"]


@BROWSER
def test_a_picture_without_curves_is_told_from_one_with_them(solution_graded: Graded) -> None:
    """The curves' measure on the same page with each picture redrawn as its bare axes."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.set(xlabel="L", ylabel="time per token", title="no curves")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    bare = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    page = selfcheck_page_of(solution_graded)
    head, *rest = page.split('src="data:image/png;base64,')
    page = head + "".join(f'src="{bare}' + r[r.index('"') :] for r in rest)
    _, pictures = shown_parts(page)
    assert pictures and max(pictures.values()) < MIN_CURVE_PIXELS, pictures
