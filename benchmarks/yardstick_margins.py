"""How far each kind of submission's cached time lies from the reference's, timed in the
same grading (the ``max_vs_reference`` criterion of checks 2.11, 3.11 and 4.6).

    python benchmarks/yardstick_margins.py [--runs 2] [--parts part2,part3,part4]
                                           [--out results/yardstick.json]

Grades only the benchmark checks, ``--runs`` times each, of:

* the reference solution;
* every correct variant of the mutant library and the course-style submissions of
  ``tests/submissions/`` that must keep full marks;
* the partial caches of ``tests/grading/test_partial_caches.py`` (work done again in
  part; other conditions of the checks stop them, the figures show how close they come);
* the cache-free baselines ``calibrate`` uses (the prefix recomputed at every step,
  disguised behind right outputs: a design that also pads or slows its runs does at
  least this work).

The criterion is judged with a limit no submission reaches (so no confirmation rounds
change the figures); what is printed is every run's ratio, per submission, and the
margins a limit in ``[cpu.partN] max_vs_reference`` has: the worst correct grading
against the closest cache-free one (a grading's figure is its largest ratio: Part 3
judges each batch size, and one miss loses the check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.core.paths import SOLUTION  # noqa: E402
from grader.core.thresholds import THRESHOLDS_ENV, load_thresholds, thresholds_text  # noqa: E402
from grader.grading.runner import grade  # noqa: E402
from grader.ta.calibrate import EXTRA_BASELINES, cache_free_submission  # noqa: E402
from grader.ta.mutants import load_mutants  # noqa: E402

COURSE = {"part2": ["course_style"], "part3": [], "part4": ["course_lab_a", "course_lab_b"]}
KEY = "max_vs_reference"


def submissions(part: str, scratch: Path) -> list[tuple[str, str, Path]]:
    """(kind, name, folder) of every submission measured for ``part``."""
    from tests.conftest import patched_solution
    from tests.grading.test_partial_caches import DESIGNS

    found = [("reference", "reference", SOLUTION)]
    found += [("correct", m.name, m.materialise()) for m in load_mutants(part, variants=True)]
    found += [("correct", n, ROOT / "tests" / "submissions" / n) for n in COURSE[part]]
    for name, (file, design_part, edits, *_rest) in DESIGNS.items():
        if design_part == part:
            found.append(("partial", name, patched_solution(scratch / name, file, edits)))
    found.append(("cache-free", "cache-free", cache_free_submission([part])))
    for extra in EXTRA_BASELINES.get(part, ()):
        found.append(("cache-free", extra, cache_free_submission([part], {part: extra})))
    return found


def loose_profile(scratch: Path) -> Path:
    """The thresholds file with every ``max_vs_reference`` set where no run reaches it."""
    text = re.sub(rf"^{KEY} = .*$", f"{KEY} = 1000.0", thresholds_text(), flags=re.M)
    for part in ("part2", "part3", "part4"):
        table = f"[cpu.{part}]\n"
        if f"{KEY} = 1000.0" not in text.split(table, 1)[1].split("\n[", 1)[0]:
            text = text.replace(table, f"{table}{KEY} = 1000.0\n", 1)
    path = scratch / "thresholds.toml"
    path.write_text(text)
    return path


def factors(folder: Path, part: str, out: Path) -> list[float]:
    """The ``max_vs_reference`` ratios (median of the runs) of one grading of the part's
    benchmark check."""
    results = grade(folder, results_path=out, parts=[part], tags=frozenset({"benchmark"}))
    if results is None:
        raise RuntimeError(f"grading {folder} crashed")
    records = results.extra_data.get("benchmarks", {}).values()
    return [c["ratio"]["median"] for r in records for c in r["criteria"] if c["key"].endswith(KEY)]


def margins(rows: list[dict], limit: float) -> dict[str, float]:
    """The worst correct grading, the closest cache-free one, and the limit's margin to
    each (a grading's figure: its largest ratio)."""
    worst = max(
        max(g) for r in rows if r["kind"] in ("reference", "correct") for g in r["gradings"]
    )
    best = min(max(g) for r in rows if r["kind"] == "cache-free" for g in r["gradings"])
    return {"worst_correct": worst, "best_cache_free": best, "limit": limit,
            "margin_correct": limit / worst, "margin_cache_free": best / limit}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--parts", default="part2,part3,part4")
    parser.add_argument("--out", default=str(ROOT / "results" / "yardstick.json"))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="yardstick-"))
    profile = load_thresholds("cpu")
    limits = {p: profile[p].get(KEY, math.nan) for p in ("part2", "part3", "part4")}
    os.environ[THRESHOLDS_ENV] = str(loose_profile(scratch))
    report: dict[str, dict] = {}
    try:
        for part in args.parts.split(","):
            rows = []
            for kind, name, folder in submissions(part, scratch):
                gradings = [
                    factors(folder, part, scratch / f"{part}-{name}-{i}.json")
                    for i in range(args.runs)
                ]
                rows.append({"kind": kind, "name": name, "gradings": gradings})
                shown = " | ".join(" ".join(f"{f:.2f}" for f in g) for g in gradings)
                print(f"{part} {kind:10} {name:36} {shown}")
            report[part] = {"rows": rows, **margins(rows, limits[part])}
            m = report[part]
            print(
                f"{part}: worst correct {m['worst_correct']:.2f}x, closest cache-free "
                f"{m['best_cache_free']:.2f}x; limit {m['limit']:g}x is "
                f"{m['margin_correct']:.2f}x and {m['margin_cache_free']:.2f}x from them"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
