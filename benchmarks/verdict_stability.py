"""Verdict stability of the graded benchmark checks on a noisy machine.

    python benchmarks/verdict_stability.py [--runs 50] [--condition busy|half-cpu|both|paired|heavy]
                                           [--out results/stability.json] [--device cpu|cuda]
                                           [--deadline SECONDS] [--extra-baselines]
                                           [--partial-caches] [--variants] [--jobs 2]
                                           [--whole] [--parts part3]
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
* ``paired``: a run's gradings go ``--jobs`` at a time (every one at once by default),
  as in a class regrade, so that each shares the machine (on a GPU node, the GPU).
* ``heavy`` (asked for by name): a busy loop on every CPU this process may use, and two
  other gradings of the reference side by side all along (``heavy_load.py``): a load of
  about 8 on 2 cores.

``--extra-baselines`` adds a third submission, the cache-free designs that come
closer to the reference (``calibrate``'s extra baselines, every part at once), so
that one run of the script also holds every ratio ``calibrate`` proposes from.
``--partial-caches`` adds the caches that do part of the work again
(``tests/grading/test_partial_caches.py``: refreshed every k-th step, in ``generate`` or
inside ``forward``, the last tokens again, layer inputs instead of keys, a float64
cache), each graded on its own part and judged on that part's benchmark only, which it
must fail in every run; designs of different parts share a submission. ``--variants``
adds the mutant library's correct rewrites (``[[variant]]``), which must pass every
benchmark of their parts as often as the reference.
``--whole`` grades every check of a submission's parts instead of the benchmarks alone, so
that the benchmarks and the reference's runs come where a real grading has them (after the
part's other checks, and the reference before the submission's first worker); the same
benchmark checks are judged. ``--deadline`` starts no run after that many seconds;
``--out`` is rewritten after every run, so a run stopped from outside keeps what it
measured.

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

sys.path.insert(0, str(ROOT / "benchmarks"))

from heavy_load import HeavyLoad  # noqa: E402
from stability_submissions import (  # noqa: E402
    CHECKS,
    Entry,
    as_entry,
    submissions_of,
)

from grader.core.paths import SOLUTION  # noqa: E402
from grader.core.registry import PARTS  # noqa: E402
from grader.sandbox.shared import SharedForkServer, handing  # noqa: E402
from grader.ta.regrade.batch import regrade_timeout_s, shared_server  # noqa: E402
from grader.ta.regrade.cluster import (  # noqa: E402
    ClusterError,
    ClusterOptions,
    add_cluster_options,
    options_from_args,
)


def hog(cpu: int) -> subprocess.Popen:
    """A busy loop pinned to ``cpu``."""
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])


def start_grading(
    submission: Path,
    pin: int | None,
    device: str,
    parts: tuple[str, ...] = (),
    shared: SharedForkServer | None = None,
    *,
    whole: bool = False,
) -> tuple[subprocess.Popen, Path]:
    """A benchmark-only grading of ``submission`` (of ``parts``, or every part; ``whole``:
    every check of them) in a fresh process, started, offered a server forked from
    ``shared`` as a class regrade's gradings are; its error output goes to a file, so it
    never blocks on a pipe."""
    out = Path(tempfile.mkdtemp(prefix="stability-")) / "results.json"
    command = [sys.executable, "-m", "grader", "grade", str(submission), "--results", str(out),
               "--device", device]  # fmt: skip
    if not whole:
        command += ["--tags", "benchmark"]
    if parts:
        command += ["--parts", ",".join(parts)]
    if pin is not None:
        command = ["taskset", "-c", str(pin), *command]
    offer = shared.offer() if shared is not None else None
    with open(out.parent / "stderr.txt", "w") as stderr, handing(offer, dict(os.environ)) as kw:
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, **kw
        )
    return process, out


def finish_grading(process: subprocess.Popen, out: Path, device: str = "cpu") -> dict:
    """The verdicts and ratios of a grading started by ``start_grading``."""
    try:
        process.wait(timeout=regrade_timeout_s(device))
        if process.returncode != 0:
            stderr = (out.parent / "stderr.txt").read_text(errors="replace")
            raise RuntimeError(f"grading failed ({process.returncode}): {stderr[-2000:]}")
        return verdicts_of(json.loads(out.read_text()))
    finally:
        process.kill()
        shutil.rmtree(out.parent, ignore_errors=True)


def grade_once(
    submission: Path,
    pin: int | None,
    device: str = "cpu",
    parts: tuple[str, ...] = (),
    *,
    whole: bool = False,
) -> dict:
    """One benchmark-only (or ``whole``) grading in a fresh process: verdicts and ratios."""
    return finish_grading(*start_grading(submission, pin, device, parts, whole=whole), device)


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
        "undecided": sorted(c for c, r in benchmarks.items() if r.get("undecided")),
        # Why a check failed, as the student reads it (cut short): a GPU run's diagnosis.
        "failures": {
            t["number"]: reasons(t.get("output", ""))
            for t in data["tests"]
            if t["number"] in CHECKS and t["status"] != "passed"
        },
    }


def reasons(feedback: str, keep: int = 600) -> str:
    """A failed benchmark's feedback without its verdict line and table of measures: the
    sentences that say why (cut to ``keep`` characters)."""
    lines = [
        line
        for line in feedback.splitlines()
        if line.strip() and not line.lstrip().startswith(("|", "**Failed", "Timed by"))
    ]
    return "\n".join(lines)[:keep]


def run_condition(
    condition: str,
    runs: int,
    submissions: dict[str, Entry | Path],
    device: str = "cpu",
    until: float = math.inf,
    on_run: Callable[[dict[str, list[dict]]], None] | None = None,
    jobs: int = 0,
    *,
    whole: bool = False,
) -> dict:
    """``runs`` interleaved gradings of each submission under ``condition``, none started
    after the monotonic time ``until``; ``on_run`` sees the runs so far after each run.
    ``paired`` runs ``jobs`` gradings at a time (0: every one of a run at once)."""
    entries = {name: as_entry(value, name) for name, value in submissions.items()}
    # The CPUs this process may use: on a Slurm node, the job's cpuset, not the whole node.
    allowed = sorted(os.sched_getaffinity(0))
    loop = (
        None
        if condition in ("paired", "heavy")
        else hog(allowed[0 if condition == "half-cpu" else -1])
    )
    heavy = None
    if condition == "heavy":  # every CPU busy, and two other gradings beside each run
        heavy = HeavyLoad([hog(c) for c in allowed], lambda: start_grading(SOLUTION, None, device))
    pin = allowed[0] if condition == "half-cpu" else None
    found: dict[str, list[dict]] = {name: [] for name in entries}
    started = time.monotonic()
    # Paired gradings share a fork server, as a class regrade's do (``batch``).
    shared = shared_server(device=device, parts=list(PARTS)) if condition == "paired" else None
    try:
        for i in range(runs):
            if time.monotonic() >= until:
                print(f"\n{condition}: deadline reached after {i} runs", end="")
                break
            if condition == "paired":  # side by side: each grading shares the machine
                pairs = side_by_side(
                    entries, pin, device, jobs or len(entries), shared, whole=whole
                )
                for name, result in pairs:
                    found[name].append(result)
            else:
                for name, e in entries.items():
                    found[name].append(grade_once(e.path, pin, device, e.parts, whole=whole))
            if on_run is not None:
                on_run(found)
            elapsed = time.monotonic() - started
            print(f"\r{condition}: run {i + 1}/{runs} ({elapsed:.0f} s)", end="", flush=True)
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
        if heavy is not None:
            heavy.stop()
        if shared is not None:
            shared.close()
    print()
    return found


def side_by_side(
    entries: dict[str, Entry],
    pin: int | None,
    device: str,
    jobs: int,
    shared: SharedForkServer | None = None,
    *,
    whole: bool = False,
) -> list[tuple[str, dict]]:
    """One grading of every entry, ``jobs`` running at once (the oldest awaited first)."""
    waiting, running, done = list(entries.items()), [], []
    while waiting or running:
        while waiting and len(running) < jobs:
            name, e = waiting.pop(0)
            started = start_grading(e.path, pin, device, e.parts, shared, whole=whole)
            running.append((name, started))
        name, (process, out) = running.pop(0)
        done.append((name, finish_grading(process, out, device)))
    return done


def tally(runs: list[dict], checks: tuple[str, ...] = CHECKS) -> dict:
    """Runs passing every judged check, runs failing every one, and per-check passes."""
    return {
        "runs": len(runs),
        "checks": list(checks),
        "all_passed": sum(all(r["passed"][c] for c in checks) for r in runs),
        "all_failed": sum(not any(r["passed"][c] for c in checks) for r in runs),
        "per_check": {c: sum(r["passed"][c] for r in runs) for c in checks},
        "confirmed": sum(r.get("confirmed", False) for r in runs),  # a miss was re-measured
        "undecided": sum(bool(r.get("undecided")) for r in runs),  # some check never decided
        "ratio_ranges": {
            key: value_range(runs, key) for key in sorted({k for r in runs for k in r["ratios"]})
        },
    }


def value_range(runs: list[dict], key: str) -> list[float]:
    values = [r["ratios"][key] for r in runs if key in r["ratios"]]
    return [min(values), max(values)]


def markdown(summary: dict) -> str:
    lines = [
        "| condition | submission | passes all judged | fails all judged "
        "| 2.11 / 3.11 / 4.6 passed | runs with confirmation rounds |",
        "|---|---|---|---|---|---|",
    ]
    for condition, by_sub in summary.items():
        for name, t in by_sub.items():
            per = " / ".join(str(t["per_check"].get(c, "-")) for c in CHECKS)
            lines.append(
                f"| {condition} | {name} | {t['all_passed']}/{t['runs']} | "
                f"{t['all_failed']}/{t['runs']} | {per} | {t['confirmed']}/{t['runs']} |"
            )
    return "\n".join(lines)


def stable(summary: dict, entries: dict[str, Entry]) -> bool:
    """The reference and every correct variant pass all their checks in all runs but one;
    every other submission fails all its checks in every run."""
    return bool(summary) and all(
        t["all_passed"] >= t["runs"] - 1 if entries[name].expect_pass else
        t["all_failed"] == t["runs"]
        for subs in summary.values() for name, t in subs.items()
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The script's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--condition", choices=["busy", "half-cpu", "both", "paired", "heavy"], default="both"
    )
    parser.add_argument(
        "--deadline", type=float, default=math.inf, help="start no run after this many seconds"
    )
    parser.add_argument(
        "--extra-baselines",
        action="store_true",
        help="also grade the cache-free designs that come closer to the reference",
    )
    parser.add_argument(
        "--partial-caches",
        action="store_true",
        help="also grade the partial caches of tests/grading/test_partial_caches.py",
    )
    parser.add_argument(
        "--variants", action="store_true", help="also grade the mutant library's correct variants"
    )
    parser.add_argument(
        "--parts", default="", help="comma-separated benchmark parts to grade (default: all)"
    )
    parser.add_argument(
        "--jobs", type=int, default=0, help="paired: gradings at once (0: a whole run at once)"
    )
    parser.add_argument(
        "--whole",
        action="store_true",
        help="grade every check, the benchmarks where a real grading runs them",
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

    entries = submissions_of(args)
    conditions = ["busy", "half-cpu"] if args.condition == "both" else [args.condition]
    until = time.monotonic() + args.deadline
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw: dict[str, dict] = {}
    summary: dict[str, dict] = {}

    def save(condition: str, found: dict[str, list[dict]]) -> None:
        raw[condition] = found
        summary[condition] = {n: tally(r, entries[n].checks) for n, r in found.items() if r}
        out.write_text(json.dumps({"summary": summary, "runs": raw}, indent=2) + "\n")

    try:
        for condition in conditions:
            found = run_condition(
                condition, args.runs, entries, args.device, until,
                on_run=lambda f, c=condition: save(c, f), jobs=args.jobs, whole=args.whole,
            )  # fmt: skip
            save(condition, found)
    finally:
        for e in entries.values():
            if e.path != SOLUTION:  # the temporary copies
                shutil.rmtree(e.path, ignore_errors=True)
    print(markdown(summary))
    for condition, by_sub in summary.items():
        for name, t in by_sub.items():
            print(f"{condition}, {name}: ratio ranges {t['ratio_ranges']}")
    ok = stable(summary, entries)
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
        *(["--partial-caches"] if args.partial_caches else []),
        *(["--variants"] if args.variants else []),
        *(["--parts", args.parts] if args.parts else []),
        *(["--whole"] if args.whole else []),
        *(["--jobs", str(args.jobs)] if args.jobs else []),
    ]  # fmt: skip
    log_dir = cluster.log_dir or ROOT / "results" / "cluster" / "stability"
    try:
        return run_command_job(command, cluster, log_dir=log_dir, cwd=ROOT)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
