"""``report.html``: a regrade of a whole class in one self-contained page.

Score histograms per part, per-check pass rates, the distribution of every benchmark
measurement with its threshold drawn in, the mistake census (how many students got each
named cause, with the checks that named it and one anonymous example message), and a row
per submission linking to its feedback further down the same page. Pictures are PNGs
drawn by matplotlib (headless) and embedded as data URIs: the file opens offline, from a
mail attachment or a shared drive, with no server.
"""

from __future__ import annotations

import html
import textwrap
from pathlib import Path
from typing import Any

from grader.core.feedback import check_html, page_text
from grader.core.figures import png_uri, pyplot
from grader.core.points import part_total
from grader.core.registry import PARTS
from grader.core.score import points_label as points_of
from grader.ta.regrade.census import Cause, Measure, census, measures, timing_doubts
from grader.ta.regrade.outputs import Row, pass_rates, score_sentence, spread, total_sentence

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; }
pre { white-space: pre-wrap; background: #f7f7f7; padding: .6em; max-width: 60em; }
.feedback { margin-left: 1em; max-width: 60em; }
img { max-width: 100%; }
.failed { color: #a00; }
"""
#: The pictures' resolution (matplotlib's points are 1/72 in: a 10 pt label is 12.5 px).
DPI = 90
#: The characters of a benchmark chart's title line: what a 4.2 in chart holds at 12 pt.
TITLE_CHARS = 34


def whole_counts(ax: Any) -> None:
    """Count axis ticks at whole submissions only (never 0.5 of a submission)."""
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def draw_part(ax: Any, part: str, scores: list[float]) -> None:
    """One part's score histogram on ``ax``: ten bins from 0 to the part's maximum, so a
    class that all scored 0 shows one bar at 0 on the part's own axis (not -0.5..0.5)."""
    top = max([part_total(part), *scores]) or 1.0
    ax.hist(scores, bins=10, range=(0.0, top), edgecolor="k")
    ax.set_xlim(0.0, top)
    whole_counts(ax)
    ax.set(title=part, xlabel=f"score (of {part_total(part):g})", ylabel="submissions")


def part_histograms(rows: list[Row]) -> str:
    """One histogram of scores per graded part, as an embedded PNG ("" without scores)."""
    parts = [p for p in PARTS if any(r.parts.get(p) is not None for r in rows)]
    if not parts:
        return ""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(parts), figsize=(3.2 * len(parts), 2.8), squeeze=False)
    for ax, part in zip(axes[0], parts, strict=True):
        draw_part(ax, part, [r.parts[part] for r in rows if r.parts.get(part) is not None])
    fig.tight_layout()
    return png_uri(fig)


def measure_span(m: Measure) -> tuple[float, float]:
    """The x axis of a criterion's plot: every value and the threshold, with a margin (a
    tenth of the threshold where all of them coincide)."""
    lo, hi = min(*m.values, m.limit), max(*m.values, m.limit)
    pad = (hi - lo) * 0.1 or abs(m.limit) * 0.1 or 0.5
    return lo - pad, hi + pad


def draw_measure(ax: Any, m: Measure) -> None:
    """One criterion's class distribution on ``ax``: the threshold dashed and the failing
    side shaded, both named in the axis label rather than a legend over the bars."""
    lo, hi = measure_span(m)
    ax.hist(m.values, bins=12, range=(lo, hi), edgecolor="k")
    ax.axvline(m.limit, color="tab:red", linestyle="--")
    ax.axvspan(lo if m.at_least else m.limit, m.limit if m.at_least else hi,
               color="tab:red", alpha=0.1)  # fmt: skip
    ax.set_xlim(lo, hi)
    whole_counts(ax)
    # matplotlib's title size (larger than the tick labels), wrapped to the chart's width
    # so that a long criterion is neither cut at the figure's edge nor drawn over the next
    ax.set_title(textwrap.fill(m.key, TITLE_CHARS))
    ax.set_xlabel(f"median ratio (threshold {m.limit:g}x dashed)")
    ax.set_ylabel("submissions")


def text_px(fig: Any, dpi: int) -> dict[str, float]:
    """The smallest chart title and the largest tick label of ``fig``, in the picture's own
    pixels at ``dpi``: the page states them beside the picture, so a browser that scales
    the picture can tell what size a TA reads them at."""
    axes = [ax for ax in fig.axes if ax.get_title()]
    ticks = [t for ax in axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    size = {
        "title": min((ax.title.get_fontsize() for ax in axes), default=0.0),
        "tick": max((t.get_fontsize() for t in ticks if t.get_text()), default=0.0),
    }
    return {k: round(v * dpi / 72, 2) for k, v in size.items()}


def measure_figure(found: list[Measure]) -> Any:
    """Each criterion's class distribution (:func:`draw_measure`), three charts a row."""
    plt = pyplot()
    cols = min(3, len(found))
    rows = -(-len(found) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.9 * rows), squeeze=False)
    for ax, m in zip(axes.flat, found, strict=False):
        draw_measure(ax, m)
    for ax in list(axes.flat)[len(found) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.canvas.draw()  # the tick labels' texts exist once the figure is drawn
    return fig


def measure_plots(found: list[Measure]) -> tuple[str, dict[str, float]]:
    """Each benchmark criterion's class distribution, its threshold a dashed line and the
    failing side shaded ("" when the regrade timed nothing), with its text sizes
    (:func:`text_px`)."""
    found = [m for m in found if m.values]
    if not found:
        return "", {}
    fig = measure_figure(found)
    sizes = text_px(fig, DPI)
    return png_uri(fig, dpi=DPI), sizes


def esc(value: Any) -> str:
    return html.escape(str(value))


def census_table(causes: list[Cause]) -> str:
    if not causes:
        return "<p>No known mistake was named.</p>"
    rows = []
    for c in causes:
        checks = ", ".join(f"{n} ({k})" for n, k in c.checks.items())
        rows.append(
            f"<tr><td><code>{esc(c.cause)}</code></td><td>{c.kind}</td>"
            f'<td class="num">{c.count}</td>'
            f"<td>{esc(checks)}</td><td><details><summary>example</summary>"
            f"<pre>{esc(c.example)}</pre></details></td></tr>"
        )
    head = (
        "<tr><th>cause</th><th>kind</th><th>submissions</th><th>named by (how many)</th>"
        "<th></th></tr>"
    )
    return f'<table id="census">{head}{"".join(rows)}</table>'


def rates_table(results: list[dict[str, Any]]) -> str:
    rows = "".join(
        f"<tr><td>{esc(r.number)}</td><td>{esc(r.name)}</td>"
        f'<td class="num">{r.passed}/{r.total}</td>'
        f'<td class="num">{100 * r.passed / r.total:.0f}%</td></tr>'
        for r in pass_rates(results)
    )
    return f"<table><tr><th>check</th><th>name</th><th>passed</th><th>%</th></tr>{rows}</table>"


def anchor(sub_id: str) -> str:
    return "sub-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in sub_id)


def kept_status(row: Row) -> str:
    """A row's status cell: how its grading ended, "(kept)" where an earlier run graded it."""
    return f"{row.recorded} (kept)" if row.status == "skipped" else row.status


def students_table(rows: list[Row]) -> str:
    parts = [p for p in PARTS if any(r.parts.get(p) is not None for r in rows)]
    head = "".join(f"<th>{p}</th>" for p in parts)
    body = []
    for r in rows:
        names = "; ".join(p.name for p in r.submitters if p.name)
        scores = "".join(
            f'<td class="num">{"" if r.parts.get(p) is None else f"{r.parts[p]:g}"}</td>'
            for p in parts
        )
        body.append(
            f'<tr><td><a href="#{anchor(r.submission_id)}">{esc(r.submission_id)}</a></td>'
            f"<td>{esc(names)}</td><td>{esc(kept_status(r))}</td>{scores}"
            f'<td class="num">{esc(r.score.text())}</td></tr>'
        )
    return (
        f"<table><tr><th>submission</th><th>names</th><th>status</th>{head}<th>total</th></tr>"
        f"{''.join(body)}</table>"
    )


def feedback_sections(rows: list[Row], results: dict[str, dict[str, Any]]) -> str:
    """Each submission's failed checks, as its student read them, in HTML (the student's
    text escaped once)."""
    sections = []
    for r in rows:
        data = results.get(r.submission_id) or {}
        page = data.get("extra_data") or {}
        failed = [t for t in data.get("tests", []) if t.get("status") != "passed"]
        checks = "".join(
            f'<h4 class="failed">{esc(t.get("name", ""))} ({esc(points_of(t))})</h4>'
            f'<div class="feedback">{check_html(t, page)}</div>'
            for t in failed
        )
        summary = page_text(str(data.get("output", "")), str(data.get("output_format", "")))
        sections.append(
            f'<details id="{anchor(r.submission_id)}"><summary>{esc(r.submission_id)}: '
            f"{esc(r.score.text())}, {len(failed)} failed</summary>"
            f"<pre>{esc(summary)}</pre>{checks}</details>"
        )
    return "".join(sections)


def class_totals(rows: list[Row]) -> str:
    """The class's score (the bonus apart) and total, as ``summary.md`` words them."""
    if not rows:
        return ""
    score = score_sentence(spread([r.score.regular for r in rows]), max(r.max_score for r in rows))
    return f"<p>{esc(score)} {esc(total_sentence(spread([r.total for r in rows])))}</p>"


def doubts_table(doubts: list[dict[str, Any]]) -> str:
    """The timed checks decided late or never, for a TA to time again on a quiet machine."""
    if not doubts:
        return "<p>Every timed check was decided within its ordinary rounds.</p>"
    body = "".join(
        f"<tr><td>{esc(d['submission'])}</td><td>{esc(d['check'])}</td>"
        f"<td>{'passed' if d['passed'] else 'failed'}</td><td>{esc('; '.join(d['undecided']))}"
        f"</td><td>{esc('; '.join(d['decided_late']))}</td></tr>"
        for d in doubts
    )
    return (
        "<p>Timed checks the runs decided only in the extra rounds, or never (judged by who "
        "made the noise): time these again on a quiet machine.</p><table><tr><th>submission"
        "</th><th>check</th><th>verdict</th><th>undecided</th><th>decided late</th></tr>"
        f"{body}</table>"
    )


def render(rows: list[Row], results: dict[str, dict[str, Any]], title: str) -> str:
    """The whole page. ``results``: submission id -> its results data."""
    causes = census(results)
    histograms = part_histograms(rows)
    plots, sizes = measure_plots(measures(results))
    images = f'<img alt="scores per part" src="{histograms}">' if histograms else ""
    bench = (f'<p>Each criterion\'s median ratio across the class; the side of the dashed '
             f'threshold that loses the points is shaded.</p><img alt="benchmark measurements" '
             f'data-title-px="{sizes.get("title")}" data-tick-px="{sizes.get("tick")}" '
             f'src="{plots}">' if plots
             else "<p>No benchmark check was timed in this regrade.</p>")  # fmt: skip
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1>"
        f"<p>{len(rows)} submissions.</p>{class_totals(rows)}<h2>Scores per part</h2>{images}"
        "<h2>Mistake census</h2><p>How many submissions each named cause was found in "
        "(a cause named only as another's look-alike is not counted). What to explain in "
        f"the next lecture.</p>{census_table(causes)}"
        f"<h2>Benchmark measurements</h2>{bench}{doubts_table(timing_doubts(results))}"
        f"<h2>Pass rate per check</h2>{rates_table(list(results.values()))}"
        f"<h2>Submissions</h2>{students_table(rows)}"
        f"<h2>Feedback</h2>{feedback_sections(rows, results)}</body></html>\n"
    )


def write_class_page(
    out_dir: Path, rows: list[Row], results: dict[str, dict[str, Any]], title: str
) -> Path:
    """Write ``out_dir/report.html`` and return its path."""
    path = Path(out_dir) / "report.html"
    path.write_text(render(rows, results, title))
    return path
