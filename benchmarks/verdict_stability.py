"""Verdict stability of the graded benchmark checks on a noisy machine.

    python benchmarks/verdict_stability.py [--runs 50] [--condition busy|half-cpu|both]
                                           [--out results/stability.json] [--device cpu|cuda]
                                           [--executor slurm --partition P --gpus-per-task 1]

Grades only the benchmark checks (2.11, 3.11, 4.6), each run a fresh
``python -m grader grade --tags benchmark`` process, of two submissions:

* the reference solution, which must pass every benchmark check in at least
  49 of ``runs`` runs;
* a disguised cache-free submission (the solution with each part's cache-free
  mistake from the mutant library: right outputs, prefix recomputed at every
  step), which must fail every benchmark check in every run.

Conditions:

* ``busy``: a busy loop keeps the other core occupied (pinned to the last CPU
  this process may use); grading is not pinned.
* ``half-cpu``: Gradescope's default ½ vCPU, simulated by pinning the grading
  and a busy loop to the first CPU this process may use with ``taskset``.

Prints a Markdown table (for a dated file under docs/measurements/) and writes every
run's ratios.

With ``--executor slurm`` (or ``submitit-local``) the same script, with the same
arguments, runs as one cluster job (``grader.ta.regrade.cluster``), so that the ``cuda`` profile
is judged on the course's GPUs; the table is printed here when the job ends and
``--out`` is written on the shared file system.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.core.paths import SOLUTION  # noqa: E402
from grader.ta.calibrate import BENCHMARK_PARTS, cache_free_submission  # noqa: E402
from grader.ta.regrade.cluster import (  # noqa: E402
    ClusterError,
    ClusterOptions,
    add_cluster_options,
    options_from_args,
)

CHECKS = ("2.11", "3.11", "4.6")


def hog(cpu: int) -> subprocess.Popen:
    """A busy loop pinned to ``cpu``."""
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])


def grade_once(submission: Path, pin: int | None, device: str = "cpu") -> dict:
    """One benchmark-only grading in a fresh process; its ``extra_data["benchmarks"]``."""
    out = Path(tempfile.mkdtemp(prefix="stability-")) / "results.json"
    command = [sys.executable, "-m", "grader", "grade", str(submission), "--results", str(out),
               "--tags", "benchmark", "--device", device]  # fmt: skip
    if pin is not None:
        command = ["taskset", "-c", str(pin), *command]
    try:
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=900)
        data = json.loads(out.read_text())
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    benchmarks = data.get("extra_data", {}).get("benchmarks", {})
    verdicts = {t["number"]: t["status"] == "passed" for t in data["tests"]}
    return {
        "passed": {c: verdicts.get(c, False) for c in CHECKS},
        "ratios": {
            c["key"]: c["ratio"]["median"] for r in benchmarks.values() for c in r["criteria"]
        },
        "confirmed": any(r.get("extra_rounds") for r in benchmarks.values()),
    }


def run_condition(
    condition: str, runs: int, submissions: dict[str, Path], device: str = "cpu"
) -> dict:
    """``runs`` interleaved gradings of each submission under ``condition``."""
    # The CPUs this process may use: on a Slurm node, the job's cpuset, not the whole node.
    allowed = sorted(os.sched_getaffinity(0))
    loop = hog(allowed[0] if condition == "half-cpu" else allowed[-1])
    pin = allowed[0] if condition == "half-cpu" else None
    found: dict[str, list[dict]] = {name: [] for name in submissions}
    started = time.monotonic()
    try:
        for i in range(runs):
            for name, path in submissions.items():
                found[name].append(grade_once(path, pin, device))
            elapsed = time.monotonic() - started
            print(f"\r{condition}: run {i + 1}/{runs} ({elapsed:.0f} s)", end="", flush=True)
    finally:
        loop.kill()
        loop.wait()
    print()
    return found


def tally(runs: list[dict]) -> dict:
    """Runs passing every benchmark check, runs failing every one, and per-check passes."""
    return {
        "runs": len(runs),
        "all_passed": sum(all(r["passed"].values()) for r in runs),
        "all_failed": sum(not any(r["passed"].values()) for r in runs),
        "per_check": {c: sum(r["passed"][c] for r in runs) for c in CHECKS},
        "confirmed": sum(r.get("confirmed", False) for r in runs),  # a miss was re-measured
        "ratio_ranges": {
            key: value_range(runs, key) for key in sorted({k for r in runs for k in r["ratios"]})
        },
    }


def value_range(runs: list[dict], key: str) -> list[float]:
    values = [r["ratios"][key] for r in runs if key in r["ratios"]]
    return [min(values), max(values)]


def markdown(summary: dict) -> str:
    lines = [
        "| condition | submission | passes all 3 | fails all 3 | 2.11 / 3.11 / 4.6 passed "
        "| runs with confirmation rounds |",
        "|---|---|---|---|---|---|",
    ]
    for condition, by_sub in summary.items():
        for name, t in by_sub.items():
            per = " / ".join(str(t["per_check"][c]) for c in CHECKS)
            lines.append(
                f"| {condition} | {name} | {t['all_passed']}/{t['runs']} | "
                f"{t['all_failed']}/{t['runs']} | {per} | {t['confirmed']}/{t['runs']} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--condition", choices=["busy", "half-cpu", "both"], default="both")
    parser.add_argument("--out", default=str(ROOT / "results" / "stability.json"))
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="the threshold profile judged (cuda: the GPU runs the models)",
    )
    add_cluster_options(parser, array=False)
    args = parser.parse_args()
    cluster = options_from_args(args)
    if cluster is not None:
        return on_cluster(args, cluster)
    if not shutil.which("taskset"):
        raise SystemExit("this script needs taskset (util-linux)")

    baseline = cache_free_submission(list(BENCHMARK_PARTS))
    submissions = {"reference": SOLUTION, "cache-free (disguised)": baseline}
    conditions = ["busy", "half-cpu"] if args.condition == "both" else [args.condition]
    raw, summary = {}, {}
    try:
        for condition in conditions:
            raw[condition] = run_condition(condition, args.runs, submissions, args.device)
            summary[condition] = {name: tally(r) for name, r in raw[condition].items()}
    finally:
        shutil.rmtree(baseline, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "runs": raw}, indent=2) + "\n")
    print(markdown(summary))
    for condition, by_sub in summary.items():
        for name, t in by_sub.items():
            print(f"{condition}, {name}: ratio ranges {t['ratio_ranges']}")
    ok = all(
        subs["reference"]["all_passed"] >= subs["reference"]["runs"] - 1
        and subs["cache-free (disguised)"]["all_failed"] == subs["cache-free (disguised)"]["runs"]
        for subs in summary.values()
    )
    print("verdicts stable" if ok else "VERDICTS NOT STABLE: see the table")
    return 0 if ok else 1


def on_cluster(args: argparse.Namespace, cluster: ClusterOptions) -> int:
    """This script with the same arguments (less the cluster's) as one cluster job."""
    from grader.ta.regrade.cluster import run_command_job

    out = Path(args.out).resolve()
    command = [
        sys.executable, str(Path(__file__).resolve()), "--runs", str(args.runs),
        "--condition", args.condition, "--out", str(out), "--device", args.device,
    ]  # fmt: skip
    log_dir = cluster.log_dir or ROOT / "results" / "cluster" / "stability"
    try:
        return run_command_job(command, cluster, log_dir=log_dir, cwd=ROOT)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
