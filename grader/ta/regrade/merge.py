"""``python -m grader merge``: Gradescope's CPU scores and a cluster's GPU scores, one sheet.

Gradescope grades every check on CPU (the ``cpu`` threshold profile). A cluster run
(``batch --executor slurm --device cuda --tags benchmark``) grades the benchmark
checks again on the course's GPUs. This command combines the two:

* ``--cpu`` a ``batch`` output folder (per-check results): every check the GPU run
  graded replaces the CPU run's check of the same number; the others are kept.
* ``--cpu`` Gradescope's score export (``.csv``, totals only): the CPU checks are not
  known one by one, so the GPU checks are added to Gradescope's total. This is right
  only when Gradescope's maximum leaves those checks out; when the two maxima add up
  to more than the assignment is worth, the merge refuses and says to pass a ``batch``
  output of the same export instead.

A submission the GPU run has no checks for (missing, or its task died or timed out)
keeps its CPU checks and is flagged ``gpu-missing``. Without ``--gpu`` a CPU-only
``batch`` output becomes the same upload sheet (every row ``cpu-only``). Output in ``--out``:
``results/<submission>/results.json`` (Gradescope's format; each check's
``extra_data.graded_by`` says which run, device and profile it came from),
``scores.csv`` (one row per student: Name, SID, Email, Total Score, Max Points, ready
for Gradescope's score upload; then each part's regular points and the Bonus, which the
Total Score includes, by the rule of :mod:`grader.core.score`) and ``merge.json``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.core.points import part_total
from grader.core.registry import PARTS
from grader.core.results import validate_results, write_results
from grader.core.score import file_score
from grader.ta.regrade.class_page import write_class_page
from grader.ta.regrade.outputs import (
    Submitter,
    make_row,
    natural_key,
    part_scores,
    read_submitters,
    safe_cell,
)

CSV_COLUMNS = ["Name", "SID", "Email", "Total Score", "Max Points", "Submission ID"]


class MergeError(ValueError):
    """The inputs cannot be merged (the CLI exits with status 2)."""


@dataclass
class Side:
    """One run's view of a submission: its results (None for a totals-only CSV row)."""

    people: list[Submitter]
    data: dict[str, Any] | None
    total: float = 0.0
    max_score: float = 0.0
    device: str = ""
    profile: str = ""
    source: str = ""
    provisional: bool = False  # judged with a profile not calibrated on its device


@dataclass
class MergeSummary:
    out_dir: Path
    counts: dict[str, int] = field(default_factory=dict)  # merged / gpu-missing / cpu-missing
    students: int = 0

    def describe(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts.items())
        return f"{counts}; {self.students} students in {self.out_dir / 'scores.csv'}"


def submission_key(name: str) -> str:
    """``submission_123`` and Gradescope's ``123`` name the same submission."""
    return name.strip().removeprefix("submission_")


def _numbered(data: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [t for t in (data or {}).get("tests", []) if t.get("number")]


def read_batch(out_dir: Path, label: str) -> dict[str, Side]:
    """A ``batch`` output: every ``results/<submission>/results.json`` and its submitters."""
    out_dir = Path(out_dir)
    if not (out_dir / "results").is_dir():
        raise MergeError(f"{out_dir} is not a batch output (no results/ folder)")
    people = read_submitters(out_dir)
    sides = {}
    for path in sorted((out_dir / "results").glob("*/results.json")):
        try:
            data = json.loads(path.read_text())
            validate_results(data)
        except (OSError, ValueError) as exc:
            raise MergeError(f"{path} is not a valid results file: {exc}") from exc
        extra = data.get("extra_data") or {}
        folder = path.parent.name
        sides[submission_key(folder)] = Side(
            people=people.get(folder, []),
            data=data,
            total=float(data.get("score") or 0.0),
            max_score=sum(float(t.get("max_score") or 0.0) for t in data.get("tests", [])),
            device=str(extra.get("device", "")),
            profile=str(extra.get("benchmark_profile", "")),
            source=f"{label} run ({out_dir})",
            # A cuda result that does not say otherwise predates calibration.
            provisional=bool(
                extra.get("benchmark_profile_provisional", extra.get("benchmark_profile") == "cuda")
            ),
        )
    return sides


def read_gradescope_csv(path: Path) -> dict[str, Side]:
    """Gradescope's score export: one row per student, grouped by ``Submission ID``.
    Names come from ``Name`` or ``First Name`` + ``Last Name``."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if not rows or "Submission ID" not in rows[0] or "Total Score" not in rows[0]:
        raise MergeError(
            f"{path}: not Gradescope's score export (needs Submission ID, Total Score)"
        )
    sides: dict[str, Side] = {}
    for row in rows:
        sub = (row.get("Submission ID") or "").strip()
        if not sub or not (row.get("Total Score") or "").strip():
            continue  # a student without a graded submission
        name = row.get("Name") or f"{row.get('First Name', '')} {row.get('Last Name', '')}"
        person = Submitter(name.strip(), row.get("SID", "").strip(), row.get("Email", "").strip())
        side = sides.setdefault(
            submission_key(sub),
            Side(
                people=[],
                data=None,
                total=float(row["Total Score"]),
                max_score=float(row.get("Max Points") or 0.0),
                device="cpu",
                profile="cpu",
                source=f"Gradescope's score export ({path})",
            ),
        )
        side.people.append(person)
    return sides


def merge_one(
    cpu: Side | None, gpu: Side | None, gpu_run: bool = True
) -> tuple[dict[str, Any], str]:
    """The merged results of one submission and its status (``gpu_run``: whether a GPU
    run was given at all)."""
    gpu_checks = _numbered(gpu.data if gpu else None)
    status = "merged" if gpu_checks else "gpu-missing" if gpu_run else "cpu-only"
    if cpu is None:
        status = "cpu-missing"
    tests: list[dict[str, Any]] = []
    taken = {t["number"] for t in gpu_checks}
    if cpu is not None and cpu.data is not None:
        tests += [
            _graded_by(t, "cpu", cpu) for t in _numbered(cpu.data) if t["number"] not in taken
        ]
    elif cpu is not None:  # totals only: Gradescope's score as one entry
        tests.append(
            _graded_by(
                {"name": "Gradescope autograder (CPU checks)", "score": cpu.total,
                 "max_score": cpu.max_score, "status": "passed" if cpu.total >= cpu.max_score
                 else "failed", "visibility": "visible"},
                "cpu", cpu,
            )
        )  # fmt: skip
    tests += [_graded_by(t, "gpu", gpu) for t in gpu_checks] if gpu else []
    tests.sort(key=lambda t: natural_key(t.get("number", "")))
    notes = {
        "merged": f"Checks {', '.join(sorted(taken, key=natural_key))} were graded on "
        f"{gpu.device if gpu else ''} with the {gpu.profile if gpu else ''} profile "
        "(the GPU run); the others come from the CPU run.",
        "gpu-missing": "The GPU run has no checks for this submission (missing, timed out or its "
        "task died): every check comes from the CPU run.",
        "cpu-missing": "The CPU run has no results for this submission: only the GPU checks "
        "are scored.",
        "cpu-only": "Every check comes from the CPU run.",
    }
    cpu_output = (cpu.data or {}).get("output", "") if cpu else ""
    data = {
        "score": round(sum(float(t.get("score") or 0.0) for t in tests), 4),
        "output": f"{notes[status]}\n\n{cpu_output}".strip(),
        "tests": tests,
        "extra_data": {
            "merge": {
                "status": status,
                "cpu": _about(cpu),
                "gpu": _about(gpu),
                "checks_from_gpu": sorted(taken, key=natural_key),
            }
        },
    }
    validate_results(data)
    return data, status


def _about(side: Side | None) -> dict[str, str] | None:
    if side is None:
        return None
    return {"source": side.source, "device": side.device, "profile": side.profile}


def _graded_by(test: dict[str, Any], run: str, side: Side) -> dict[str, Any]:
    """A copy of ``test`` that names the run, device and profile it was graded with."""
    extra = {**(test.get("extra_data") or {}), "graded_by": {"run": run, **_about(side)}}
    return {**test, "extra_data": extra}


def refuse_provisional(sides: dict[str, Side]) -> None:
    """A GPU run judged with a provisional profile cannot go into grades: its benchmark
    thresholds were never calibrated on that device."""
    provisional = sorted(k for k, side in sides.items() if side.provisional)
    if provisional:
        shown = ", ".join(f"submission_{k}" for k in provisional[:5])
        more = f" and {len(provisional) - 5} more" if len(provisional) > 5 else ""
        raise MergeError(
            f"{len(provisional)} GPU result(s) ({shown}{more}) were judged with a provisional "
            "threshold profile: its benchmark verdicts are not calibrated on that device. "
            "Calibrate it on the course's GPUs (python -m grader calibrate --device cuda, "
            "then benchmarks/verdict_stability.py --device cuda), remove `provisional` from "
            "its table in grader/core/thresholds.toml and regrade (docs/benchmarks.md)."
        )


def main(*, cpu: Path, gpu: Path | None, out_dir: Path) -> MergeSummary:
    """Merge ``cpu`` (a batch output or Gradescope's CSV) with the ``gpu`` batch output;
    without ``gpu``, turn the CPU batch output into the upload sheet alone."""
    cpu, out_dir = Path(cpu), Path(out_dir)
    totals_only = cpu.is_file()
    cpu_sides = read_gradescope_csv(cpu) if totals_only else read_batch(cpu, "CPU")
    gpu_sides = read_batch(Path(gpu), "GPU") if gpu is not None else {}
    refuse_provisional(gpu_sides)
    if totals_only:
        check_no_double_count(cpu_sides, gpu_sides)
    folders = {k: f"submission_{k}" for k in {**cpu_sides, **gpu_sides}}
    statuses = ("merged", "gpu-missing", "cpu-missing") if gpu is not None else ("cpu-only",)
    summary = MergeSummary(out_dir=out_dir, counts=dict.fromkeys(statuses, 0))
    table, records, rows, merged = [], {}, [], {}
    for key in sorted(folders, key=natural_key):
        c, g = cpu_sides.get(key), gpu_sides.get(key)
        data, status = merge_one(c, g, gpu_run=gpu is not None)
        write_results(data, out_dir / "results" / folders[key] / "results.json")
        summary.counts[status] += 1
        records[folders[key]] = data["extra_data"]["merge"]
        people = (c.people if c and c.people else None) or (g.people if g else []) or [Submitter()]
        rows.append(make_row(folders[key], people, data, status))
        merged[folders[key]] = data
        score, scores = file_score(data), part_scores(data)
        for p in people:
            table.append(
                [*(safe_cell(x) for x in (p.name, p.sid, p.email)), f"{score.total:g}",
                 f"{score.max_score:g}", safe_cell(key),
                 *("" if scores[x] is None else f"{scores[x]:g}" for x in PARTS),
                 f"{score.bonus:g}",
                 " ".join(records[folders[key]]["checks_from_gpu"]),
                 g.device if g else "", g.profile if g else "", c.profile if c else "", status]
            )  # fmt: skip
    summary.students = len(table)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "scores.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [*CSV_COLUMNS, *PARTS, "Bonus", "GPU checks", "GPU device", "GPU profile",
             "CPU profile", "merge status"]
        )  # fmt: skip
        writer.writerows(table)
    doc = {"cpu": str(cpu), "gpu": gpu and str(gpu), "counts": summary.counts,
           "submissions": records}  # fmt: skip
    (out_dir / "merge.json").write_text(json.dumps(doc, indent=2) + "\n")
    write_class_page(out_dir, rows, merged, "Merged regrade")
    return summary


def check_no_double_count(cpu: dict[str, Side], gpu: dict[str, Side]) -> None:
    """Refuse a totals-only merge whose maxima add up to more than the assignment: then
    Gradescope's total already holds the checks the GPU run graded again."""
    full = sum(part_total(p) for p in PARTS)
    for key, g in gpu.items():
        c = cpu.get(key)
        gpu_max = sum(float(t.get("max_score") or 0.0) for t in _numbered(g.data))
        if c is not None and c.max_score + gpu_max > full + 1e-6:
            raise MergeError(
                f"submission {key}: Gradescope's maximum ({c.max_score:g}) already counts the "
                f"GPU checks ({gpu_max:g} points; the assignment is worth {full:g}). Gradescope's "
                "score export has no per-check scores to replace them: regrade the same export "
                "on CPU with `kvgrader batch EXPORT --out cpu` and pass --cpu cpu instead."
            )
