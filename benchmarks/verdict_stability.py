"""Verdict stability of the graded benchmark checks on a noisy machine.

    python benchmarks/verdict_stability.py [--runs 50] [--condition busy|half-cpu|both|paired]
                                           [--out results/stability.json] [--device cpu|cuda]
                                           [--deadline SECONDS] [--extra-baselines]
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
* ``paired``: every submission of a run is graded at the same time, so that each
  grading shares the machine (on a GPU node, the GPU) with the others.

``--extra-baselines`` adds a third submission, the cache-free designs that come
closer to the reference (``calibrate``'s extra baselines, every part at once), so
that one run of the script also holds every ratio ``calibrate`` proposes from.
``--deadline`` starts no run after that many seconds; ``--out`` is rewritten after
every run, so a run stopped from outside keeps what it measured.

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
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.core.paths import SOLUTION  # noqa: E402
from grader.ta.calibrate import (  # noqa: E402
    BENCHMARK_PARTS,
    cache_free_submission,
    closer_designs,
)
from grader.ta.regrade.batch import regrade_timeout_s  # noqa: E402
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


def start_grading(submission: Path, pin: int | None, device: str) -> tuple[subprocess.Popen, Path]:
    """A benchmark-only grading of ``submission`` in a fresh process, started."""
    out = Path(tempfile.mkdtemp(prefix="stability-")) / "results.json"
    command = [sys.executable, "-m", "grader", "grade", str(submission), "--results", str(out),
               "--tags", "benchmark", "--device", device]  # fmt: skip
    if pin is not None:
        command = ["taskset", "-c", str(pin), *command]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    return process, out


def finish_grading(process: subprocess.Popen, out: Path, device: str = "cpu") -> dict:
    """The verdicts and ratios of a grading started by ``start_grading``."""
    try:
        _, stderr = process.communicate(timeout=regrade_timeout_s(device))
        if process.returncode != 0:
            raise RuntimeError(f"grading failed ({process.returncode}): {stderr[-2000:]}")
        return verdicts_of(json.loads(out.read_text()))
    finally:
        process.kill()
        shutil.rmtree(out.parent, ignore_errors=True)


def grade_once(submission: Path, pin: int | None, device: str = "cpu") -> dict:
    """One benchmark-only grading in a fresh process: its verdicts and ratios."""
    return finish_grading(*start_grading(submission, pin, device), device)


def verdicts_of(data: dict) -> dict:
    """Per benchmark check, passed or not, and every criterion's median ratio."""
    benchmarks = data.get("extra_data", {}).get("benchmarks", {})
    verdicts = {t["number"]: t["status"] == "passed" for t in data["tests"]}
    return {
        "passed": {c: verdicts.get(c, False) for c in CHECKS},
        "ratios": {
            c["key"]: c["ratio"]["median"] for r in benchmarks.values() for c in r["criteria"]
        },
        "confirmed": any(r.get("extra_rounds") for r in benchmarks.values()),
        # Why a check failed, as the student reads it (cut short): a GPU run's diagnosis.
        "failures": {
            t["number"]: t.get("output", "")[:400]
            for t in data["tests"]
            if t["number"] in CHECKS and t["status"] != "passed"
        },
    }


def run_condition(
    condition: str,
    runs: int,
    submissions: dict[str, Path],
    device: str = "cpu",
    until: float = math.inf,
    on_run: Callable[[dict[str, list[dict]]], None] | None = None,
) -> dict:
    """``runs`` interleaved gradings of each submission under ``condition``, none started
    after the monotonic time ``until``; ``on_run`` sees the runs so far after each run."""
    # The CPUs this process may use: on a Slurm node, the job's cpuset, not the whole node.
    allowed = sorted(os.sched_getaffinity(0))
    loop = None if condition == "paired" else hog(allowed[0 if condition == "half-cpu" else -1])
    pin = allowed[0] if condition == "half-cpu" else None
    found: dict[str, list[dict]] = {name: [] for name in submissions}
    started = time.monotonic()
    try:
        for i in range(runs):
            if time.monotonic() >= until:
                print(f"\n{condition}: deadline reached after {i} runs", end="")
                break
            if condition == "paired":  # all at once: each grading shares the machine
                started_now = {n: start_grading(p, pin, device) for n, p in submissions.items()}
                for name, (process, out) in started_now.items():
                    found[name].append(finish_grading(process, out, device))
            else:
                for name, path in submissions.items():
                    found[name].append(grade_once(path, pin, device))
            if on_run is not None:
                on_run(found)
            elapsed = time.monotonic() - started
            print(f"\r{condition}: run {i + 1}/{runs} ({elapsed:.0f} s)", end="", flush=True)
    finally:
        if loop is not None:
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


def build_parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--condition", choices=["busy", "half-cpu", "both", "paired"], default="both"
    )
    parser.add_argument(
        "--deadline", type=float, default=math.inf, help="start no run after this many seconds"
    )
    parser.add_argument(
        "--extra-baselines",
        action="store_true",
        help="also grade the cache-free designs that come closer to the reference",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "stability.json"))
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="the threshold profile judged (cuda: the GPU runs the models)",
    )
    add_cluster_options(parser, array=False)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    cluster = options_from_args(args)
    if cluster is not None:
        return on_cluster(args, cluster)
    if not shutil.which("taskset"):
        raise SystemExit("this script needs taskset (util-linux)")

    submissions = {
        "reference": SOLUTION,
        "cache-free (disguised)": cache_free_submission(list(BENCHMARK_PARTS)),
    }
    if args.extra_baselines:
        parts = list(BENCHMARK_PARTS)
        submissions["cache-free (closer designs)"] = cache_free_submission(
            parts, closer_designs(parts)
        )
    conditions = ["busy", "half-cpu"] if args.condition == "both" else [args.condition]
    until = time.monotonic() + args.deadline
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw: dict[str, dict] = {}
    summary: dict[str, dict] = {}

    def save(condition: str, found: dict[str, list[dict]]) -> None:
        raw[condition] = found
        summary[condition] = {name: tally(r) for name, r in found.items() if r}
        out.write_text(json.dumps({"summary": summary, "runs": raw}, indent=2) + "\n")

    try:
        for condition in conditions:
            found = run_condition(
                condition, args.runs, submissions, args.device, until,
                on_run=lambda f, c=condition: save(c, f),
            )  # fmt: skip
            save(condition, found)
    finally:
        for name, path in submissions.items():
            if name != "reference":
                shutil.rmtree(path, ignore_errors=True)
    print(markdown(summary))
    for condition, by_sub in summary.items():
        for name, t in by_sub.items():
            print(f"{condition}, {name}: ratio ranges {t['ratio_ranges']}")
    ok = bool(summary) and all(
        subs["reference"]["all_passed"] >= subs["reference"]["runs"] - 1
        and all(t["all_failed"] == t["runs"] for n, t in subs.items() if n != "reference")
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
        *(["--deadline", str(args.deadline)] if math.isfinite(args.deadline) else []),
        *(["--extra-baselines"] if args.extra_baselines else []),
    ]  # fmt: skip
    log_dir = cluster.log_dir or ROOT / "results" / "cluster" / "stability"
    try:
        return run_command_job(command, cluster, log_dir=log_dir, cwd=ROOT)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
