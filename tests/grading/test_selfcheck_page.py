"""The self-check's HTML report: three pictures drawn from a results file and the
reference's records, embedded so that the page opens offline."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from grader.grading.selfcheck_page import (
    latency_figure,
    per_token_curve,
    render,
    speedups,
    write_report,
)

#: figsize (6.4, 4) at 90 dpi
SIZE = (576, 360)


def timing(ms: float) -> dict:
    return {"median_s": ms / 1000, "cpu_median_s": ms / 1000, "runs_s": [ms / 1000]}


def part4(cached: tuple[float, float], free: tuple[float, float]) -> dict:
    return {"check": "4.6", "timings": {
        "with the cache, L = 32": timing(cached[0]), "with the cache, L = 256": timing(cached[1]),
        "without the cache, L = 32": timing(free[0]), "without the cache, L = 256": timing(free[1]),
        "the reference, with the cache, L = 256": timing(9.0),
    }}  # fmt: skip


def part3(*medians: float) -> dict:
    return {"check": "3.11", "criteria": [
        {"label": f"batch {b} speedup (cpu time)", "ratio": {"median": m}, "limit": 2.0,
         "at_least": True, "passed": m >= 2.0}
        for b, m in zip((1, 8, 16), medians, strict=False)
    ]}  # fmt: skip


def results() -> dict:
    errors = {"case": "case 1 (8 tokens)", "tolerance": 0.01, "positions": list(range(8)),
              "max_error": [5e-5, 7.0, 6.5, 6.6, 7.7, 6.8, 5.0, 5.9]}  # fmt: skip
    tests = [
        {"number": "2.4", "name": "2.4 sequential", "status": "failed", "score": 0,
         "max_score": 4, "tags": ["part2"], "output": "**Failed**",
         "extra_data": {"logit_errors": errors}},
        {"number": "3.11", "name": "3.11 benchmark", "status": "passed", "score": 2,
         "max_score": 2, "tags": ["part3"]},
        {"number": "4.6", "name": "4.6 latency", "status": "passed", "score": 4,
         "max_score": 4, "tags": ["part4"]},
    ]  # fmt: skip
    bench = {"3.11": part3(2.5, 6.0, 9.0), "4.6": part4((1.0, 1.1), (1.3, 2.8))}
    return {"output": "Total: 6 / 10", "tests": tests, "extra_data": {"benchmarks": bench}}


def images(page: str) -> dict[str, Image.Image]:
    found = {}
    for alt, data in re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)"', page):
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.load()
        found[alt] = image
    return found


def test_the_report_holds_the_three_pictures(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(results()))
    reference = {"measured": "2026-11-26, a CPU", "benchmarks": {
        "3.11": part3(2.7, 6.0, 9.1), "4.6": part4((0.9, 0.9), (1.3, 2.8))}}  # fmt: skip
    (tmp_path / "ref.json").write_text(json.dumps(reference))
    page = write_report(tmp_path / "r.json", tmp_path / "r.html", tmp_path / "ref.json")
    found = images(page.read_text())
    assert set(found) == {
        "Part 4: latency against L", "Part 3: speedup per batch size",
        "Part 2: per-position logit error",
    }  # fmt: skip
    assert all(image.size == SIZE and image.format == "PNG" for image in found.values())
    assert "2026-11-26, a CPU" in page.read_text()
    assert 'src="http' not in page.read_text()


def test_a_part_without_data_says_why_instead_of_drawing() -> None:
    data = results()
    data["extra_data"]["benchmarks"] = {}
    data["tests"][0]["extra_data"] = {}
    page = render(data, {})
    assert images(page) == {}
    assert "No picture: check 4.6 stopped before its timed runs" in page
    assert "No picture: check 2.4 failed before any logits could be compared" in page


def test_the_blank_skeleton_is_not_told_that_no_logits_check_failed() -> None:
    data = results()
    data["tests"] = [
        {"number": n, "name": f"{n} logits", "status": "failed", "score": 0, "max_score": 4,
         "tags": ["part2"], "output": "It raised NotImplementedError."}
        for n in ("2.1", "2.2", "2.3", "2.4", "2.5")
    ]  # fmt: skip
    page = render(data, {})
    assert "no Part 2 logits check failed" not in page
    assert "checks 2.2, 2.3, 2.4, 2.5 failed before any logits could be compared" in page
    for t in data["tests"]:
        t.update(status="passed", score=4)
    assert "No picture: every Part 2 logits check passed" in render(data, {})


def test_the_curves_are_read_by_variant_and_l_and_drawn_relative() -> None:
    record = part4((2.0, 2.2), (2.6, 5.6))
    assert per_token_curve(record, "with the cache") == {32: 0.002, 256: 0.0022}
    assert speedups(part3(2.5, 6.0)) == {1: (2.5, 2.0), 8: (6.0, 2.0)}
    fig = latency_figure(record, None)
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines["your code, with the cache"] == pytest.approx([1.0, 1.1])  # cached, L = 32
    assert lines["your code, without the cache"] == pytest.approx([1.3, 2.8])


def test_the_feedback_is_html_and_never_says_to_run_the_self_check_again() -> None:
    from grader.core.feedback import markdown_results
    from grader.core.results import GradingResults, TestResult

    raised = "It raised NameError: name <module> is not defined."
    test = TestResult("2.2 logits", 0, 1, "failed", "2.2", raised, ["part2"])
    data = markdown_results(GradingResults(tests=[test], output="part2: 0 / 1 <x>")).to_gradescope()
    page = render(data, {})
    assert "selfcheck.py" not in page and "**" not in page and "&amp;lt;" not in page
    assert "<strong>Failed: 0 / 1 point.</strong>" in page
    assert "name &lt;module&gt; is not defined" in page
    assert "<pre>part2: 0 / 1 &lt;x&gt;</pre>" in page


def test_the_pictures_follow_the_parts_order_and_the_footnote_its_curves() -> None:
    """Parts 2, 3, 4 in that order; the note on where the reference was measured only
    under a picture that draws the reference."""
    reference = {"measured": "2026-11-26, a CPU", "benchmarks": {"4.6": part4((1, 1), (1, 2))}}
    page = render(results(), reference)
    titles = re.findall(r"<h2>(Part \d)", page)
    assert titles == ["Part 2", "Part 3", "Part 4"]
    assert "2026-11-26, a CPU" in page
    only2 = results()
    only2["tests"] = only2["tests"][:1]
    only2["extra_data"]["benchmarks"] = {}
    assert "2026-11-26, a CPU" not in render(only2, reference)


def test_the_latency_curve_is_drawn_on_the_clock_the_verdicts_used() -> None:
    """On the cpu profile 4.6 judges CPU time: its curve is of CPU time, whatever the wall
    clock did; on cuda it is of wall time."""
    record = part4((1.0, 1.0), (1.0, 2.0))
    for name, timing in record["timings"].items():
        timing["median_s"] = timing["cpu_median_s"] * (6 if name.startswith("without") else 1)
    assert per_token_curve({**record, "profile": "cpu"}, "without the cache") == {
        32: pytest.approx(0.001), 256: pytest.approx(0.002)}  # fmt: skip
    assert per_token_curve({**record, "profile": "cuda"}, "without the cache") == {
        32: pytest.approx(0.006), 256: pytest.approx(0.012)}  # fmt: skip
    fig = latency_figure({**record, "profile": "cpu"}, None)
    assert fig.axes[0].get_ylabel() == "CPU time per token (relative)"
