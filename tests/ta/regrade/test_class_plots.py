"""The class report's pictures read right: whole submissions on every count axis, no legend
over the bars, and a class that all scored the same drawn on a sensible axis."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.core.figures import pyplot
from grader.core.points import part_total
from grader.ta.regrade.census import Measure
from grader.ta.regrade.class_page import draw_measure, draw_part
from grader.ta.regrade.outputs import histogram, save_histogram


@pytest.fixture
def ax():
    plt = pyplot()
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def whole(ax) -> bool:
    """Whether every count tick is a whole number of submissions."""
    ax.figure.canvas.draw()
    return all(float(t).is_integer() for t in ax.get_yticks())


def test_an_all_zero_part_is_drawn_on_the_parts_own_axis(ax) -> None:
    draw_part(ax, "part1", [0.0, 0.0, 0.0])
    assert ax.get_xlim() == (0.0, part_total("part1"))  # not -0.5..0.5
    assert whole(ax)


def test_a_small_class_has_no_fractional_submission_ticks(ax) -> None:
    draw_part(ax, "part2", [3.0, 30.0])  # one submission per bar: matplotlib's own 0.2 steps
    assert whole(ax)


def test_a_measure_has_no_legend_over_its_bars_and_a_sensible_axis(ax) -> None:
    draw_measure(ax, Measure("2.11 speedup", "speedup", 3.0, True, (0.0, 0.0, 0.0)))
    assert ax.get_legend() is None  # the threshold is named in the axis label
    assert "threshold 3x" in ax.get_xlabel()
    lo, hi = ax.get_xlim()
    assert lo < 0.0 and hi > 3.0 and (lo, hi) != (-0.5, 0.5)
    assert whole(ax)


def test_a_measures_title_and_label_are_no_smaller_than_its_tick_labels(ax) -> None:
    """The chart's title (the criterion) reads before its numbers, and its axis label is
    not the smallest text on it."""
    draw_measure(ax, Measure("part3.min_speedup.16", "speedup", 5.05, True, (4.0, 9.0)))
    ax.figure.canvas.draw()
    ticks = max(t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels())
    assert ax.title.get_fontsize() > ticks
    assert ax.xaxis.label.get_fontsize() >= ticks


def test_the_score_histograms_legend_is_beside_the_bars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plt = pyplot()
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    bins = histogram([24.0, 20.0, 3.0], max_score=20.0)
    save_histogram(bins, tmp_path / "h.png", max_score=20.0)
    (fig,) = closed
    ax = fig.axes[0]
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1  # right of the plot, over no bar
    assert whole(ax)
    monkeypatch.undo()
    plt.close(fig)
