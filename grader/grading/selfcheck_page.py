"""The self-check's HTML report: the feedback of every check and three pictures.

* Part 4: time per generated token against the context length L, the student's cached and
  cache-free runs next to the reference's, each relative to its own cached time at the
  shortest L (the reference was timed on another machine: shapes compare, milliseconds
  would not).
* Part 3: the cached speedup at each batch size against the check's thresholds, beside
  the reference's.
* Part 2: where a logits check failed, the largest error at each sequence position of its
  first failing case, against the tolerance: the step where the cache goes wrong.

One self-contained file (PNGs embedded as data URIs, matplotlib headless) that opens
offline. Drawn from the results file and the reference's recorded benchmarks alone: a
report never runs student code.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from grader.core.feedback import check_html, page_text
from grader.core.figures import png_uri, pyplot
from grader.core.score import points_label

#: The reference's benchmark records, measured by ``python -m grader reference-benchmarks``
#: and shipped beside selfcheck.py.
REFERENCE_FILE = "reference_benchmarks.json"

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
pre { white-space: pre-wrap; background: #f7f7f7; padding: .6em; }
img { max-width: 100%; border: 1px solid #ddd; }
.failed { color: #a00; } .passed { color: #070; }
table { border-collapse: collapse; margin: .6em 0; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; vertical-align: top; }
"""


def judged_seconds(record: dict[str, Any]) -> tuple[str, str]:
    """Which median of a record's timings its verdicts were judged on, and its name: CPU
    seconds on the cpu profile (check 4.6's growth and speedup are CPU-time ratios), wall
    seconds on cuda. A curve of the other clock is not what the grader measured: on a
    laptop with idle cores the wall clock of the cache-free runs grows otherwise."""
    if record.get("profile") == "cuda":
        return "median_s", "time"
    return "cpu_median_s", "CPU time"


def per_token_curve(record: dict[str, Any], variant: str) -> dict[int, float]:
    """L -> median time per token (on the clock the verdicts used) of the runs named
    "<variant>, L = <L>"; wall seconds where a run has no CPU figure."""
    key, _ = judged_seconds(record)
    curve = {}
    for name, timing in (record.get("timings") or {}).items():
        m = re.fullmatch(rf"{re.escape(variant)}, L = (\d+)", name)
        value = (
            timing.get(key) if isinstance(timing.get(key), int | float) else timing.get("median_s")
        )
        if m and isinstance(value, int | float):
            curve[int(m[1])] = float(value)
    return dict(sorted(curve.items()))


def latency_figure(record: dict[str, Any] | None, reference: dict[str, Any] | None) -> Any:
    """Part 4's picture, or None when check 4.6 timed nothing."""
    mine = {v: per_token_curve(record or {}, v) for v in ("with the cache", "without the cache")}
    if not mine["with the cache"]:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    sources = [("your code", mine, "-o")]
    if reference:
        ref = {v: per_token_curve(reference, v) for v in mine}
        if ref["with the cache"]:
            sources.append(("reference", ref, ":s"))
    for who, curves, style in sources:
        base = next(iter(curves["with the cache"].values()))
        for variant, colour in (("with the cache", "tab:blue"), ("without the cache", "tab:red")):
            xs = list(curves[variant])
            ys = [curves[variant][x] / base for x in xs]
            ax.plot(xs, ys, style, color=colour, alpha=1.0 if who == "your code" else 0.6,
                    label=f"{who}, {variant}")  # fmt: skip
    clock = judged_seconds(record or {})[1]
    ax.set(xlabel="context length L (tokens)", ylabel=f"{clock} per token (relative)",
           title="Part 4: time per generated token against L")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speedups(record: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """Batch size -> (median speedup, threshold) of check 3.11's criteria."""
    found = {}
    for c in record.get("criteria", []):
        m = re.match(r"batch (\d+) speedup", str(c.get("label", "")))
        median = (c.get("ratio") or {}).get("median")
        if m and isinstance(median, int | float):
            found[int(m[1])] = (float(median), float(c.get("limit", 0.0)))
    return dict(sorted(found.items()))


def speedup_figure(record: dict[str, Any] | None, reference: dict[str, Any] | None) -> Any:
    """Part 3's picture, or None when check 3.11 timed nothing."""
    mine = speedups(record or {})
    if not mine:
        return None
    ref = speedups(reference or {})
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    xs = range(len(mine))
    width = 0.38 if ref else 0.6
    ax.bar([x - (width / 2 if ref else 0) for x in xs], [v[0] for v in mine.values()], width,
           label="your code", color="tab:blue")  # fmt: skip
    if ref:
        ax.bar([x + width / 2 for x in xs], [ref.get(b, (0.0, 0.0))[0] for b in mine], width,
               label="reference", color="tab:gray")  # fmt: skip
    for x, (_, limit) in zip(xs, mine.values(), strict=True):
        ax.hlines(limit, x - 0.45, x + 0.45, colors="tab:red", linestyles="--")
    ax.plot([], [], "--", color="tab:red", label="threshold")
    ax.set_xticks(list(xs), [f"batch {b}" for b in mine])
    ax.set(ylabel="speedup (cache-free / cached)", title="Part 3: cached speedup per batch size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def logit_error_figure(tests: list[dict[str, Any]]) -> Any:
    """Part 2's picture: each failed check's largest logit error per position, or None."""
    failed = [t for t in tests if t.get("status") == "failed"
              and (t.get("extra_data") or {}).get("logit_errors")]  # fmt: skip
    if not failed:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4))
    tolerance = 0.0
    for t in failed[:4]:
        e = t["extra_data"]["logit_errors"]
        points = [(p + 1, err) for p, err in zip(e["positions"], e["max_error"], strict=False)
                  if isinstance(err, int | float)]  # fmt: skip
        ax.plot([p for p, _ in points], [max(err, 1e-9) for _, err in points], "-o",
                markersize=3, label=f"{t.get('number', '')}: {e.get('case', '')}")  # fmt: skip
        tolerance = max(tolerance, float(e.get("tolerance", 0.0)))
    ax.axhline(tolerance, color="tab:red", linestyle="--", label=f"tolerance {tolerance:g}")
    ax.set_yscale("log")
    ax.set(xlabel="sequence position", ylabel="largest |logit error|",
           title="Part 2: where the logits go wrong")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


#: The pictures in the parts' order: (part, title, why there is none; "" for Part 2's,
#: which :func:`logits_missing` words) and whether the reference is drawn beside it.
PICTURES = (
    ("part2", "Part 2: per-position logit error", "", False),
    ("part3", "Part 3: speedup per batch size", "check 3.11 stopped before its timed runs "
     "(its feedback below says why)", True),
    ("part4", "Part 4: latency against L", "check 4.6 stopped before its timed runs (its "
     "feedback below says why)", True),
)  # fmt: skip
#: Part 2's public logits checks: the ones that record their errors per position.
LOGITS_CHECKS = ("2.2", "2.3", "2.4", "2.5")


def logits_missing(tests: list[dict[str, Any]]) -> str:
    """Why Part 2 has no picture: every logits check passed, or those that failed had no
    logits to compare (an exception, a wrong shape: their feedback says which)."""
    failed = [str(t.get("number")) for t in tests
              if t.get("number") in LOGITS_CHECKS and t.get("status") != "passed"]  # fmt: skip
    if not failed:
        return "every Part 2 logits check passed"
    return (
        f"{'check ' + failed[0] if len(failed) == 1 else 'checks ' + ', '.join(failed)} "
        "failed before any logits could be compared (their feedback below says why)"
    )


def pictures(data: dict[str, Any], reference: dict[str, Any]) -> dict[str, str]:
    """part -> an embedded PNG, for the parts whose picture has data."""
    mine = (data.get("extra_data") or {}).get("benchmarks") or {}
    ref = reference.get("benchmarks") or {}
    figures = {
        "part4": latency_figure(mine.get("4.6"), ref.get("4.6")),
        "part3": speedup_figure(mine.get("3.11"), ref.get("3.11")),
        "part2": logit_error_figure(
            [t for t in data.get("tests", []) if "part2" in t.get("tags", [])]
        ),
    }
    return {part: png_uri(fig) for part, fig in figures.items() if fig is not None}


def render(data: dict[str, Any], reference: dict[str, Any]) -> str:
    """The report page for one results file."""
    esc = html.escape
    graded = {p for t in data.get("tests", []) for p in t.get("tags", []) if p.startswith("part")}
    drawn = pictures(data, reference)
    blocks, beside = [], False
    for part, title, missing, with_reference in PICTURES:
        if part not in graded:
            continue
        missing = missing or logits_missing(data.get("tests", []))
        body = (f'<img alt="{esc(title)}" src="{drawn[part]}">' if part in drawn
                else f"<p>No picture: {esc(missing)}.</p>")  # fmt: skip
        blocks.append(f"<h2>{esc(title)}</h2>{body}")
        beside = beside or (with_reference and part in drawn)
    if beside and reference.get("measured"):
        blocks.append(f"<p><small>The reference's curves: {esc(str(reference['measured']))}."
                      "</small></p>")  # fmt: skip
    page = data.get("extra_data") or {}
    checks = "".join(
        f'<h3 class="{"passed" if t.get("status") == "passed" else "failed"}">'
        f"{esc(str(t.get('name', '')))} ({esc(points_label(t))})</h3>"
        f'<div class="feedback">{check_html(t, page, local=True)}</div>'
        for t in data.get("tests", [])
    )
    summary = page_text(str(data.get("output", "")), str(data.get("output_format", "")))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Self-check report</title>"
        f"<style>{STYLE}</style></head><body><h1>Self-check report</h1>"
        f"<pre>{esc(summary)}</pre>{''.join(blocks)}"
        f"<h2>Every check's feedback</h2>{checks}</body></html>\n"
    )


def write_report(results: Path, out: Path, reference: Path | None) -> Path:
    """Read ``results`` (and the reference's records, where the file exists) and write the
    report to ``out``."""
    data = json.loads(Path(results).read_text())
    ref: dict[str, Any] = {}
    if reference is not None and Path(reference).is_file():
        ref = json.loads(Path(reference).read_text())
    Path(out).write_text(render(data, ref))
    return Path(out)
