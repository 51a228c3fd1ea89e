"""Resource budget of a whole grading run, against Gradescope's defaults.

    python benchmarks/grading_budget.py [SUBMISSION] [--half-cpu] [--runs N] [--poll-ms 100]
                                        [--shared]

Grades SUBMISSION (default: solution/) with ``python -m grader grade`` in a child
process and samples, every 100 ms, the memory of that process and every
process below it (the workers): the sum of RSS (counts shared pages once per
process, an upper bound) and, where readable, the sum of PSS (shared pages
split between processes; close to what a container's memory limit charges).
Prints the peaks, the wall time and any check that failed, for each of ``--runs``
gradings, and how many benchmark checks needed confirmation rounds
(``extra_data.benchmarks.*.extra_rounds``). ``--poll-ms 0`` samples no memory,
to see whether the sampling itself disturbs the timed checks: reading a process's
PSS walks its page tables, and at 1/2 CPU sampling every 20 or 100 ms stalled
18-20 % of the timed runs by more than 150 ms, against 0.9 % with no sampling
(docs/benchmarks.md). Read scores and times at 1/2 CPU from ``--poll-ms 0``.

``--half-cpu`` simulates Gradescope's default ½ vCPU: the grading and a
busy loop are both pinned to CPU 0 with ``taskset``, so the grader gets about
half of one core.

``--shared`` grades as a class regrade does: one shared fork server, started before
the first grading and not counted, offers each grading a server forked for it (its
libraries already imported). The CPU seconds then add what the shared server's
descendants used during the grading (its per-grading server and that server's workers).
Not with ``--half-cpu``: Gradescope grades one submission per container, and the shared
server's workers would not be pinned.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from verdict_stability import hog  # noqa: E402  (the same pinned busy loop)

from grader.core.registry import PARTS  # noqa: E402
from grader.sandbox.shared import SharedForkServer, handing  # noqa: E402
from grader.ta.regrade.batch import shared_server  # noqa: E402


def tree_memory(proc: psutil.Process) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) over ``proc`` and its descendants, in bytes."""
    rss = pss = 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for p in members:
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        except psutil.Error:
            continue
    return rss, pss


def stalled_runs(benchmarks: dict[str, Any], slack_s: float = 0.15) -> tuple[int, int]:
    """(timed runs, runs more than ``slack_s`` slower than the fastest run of their variant)
    over the benchmark records of a ``results.json``: how often a run was stalled."""
    runs = [t["runs_s"] for record in benchmarks.values() for t in record["timings"].values()]
    stalled = sum(r - min(series) > slack_s for series in runs for r in series)
    return sum(len(series) for series in runs), stalled


def children_cpu(shared: SharedForkServer | None) -> float:
    """CPU seconds of every process this one has waited for, and of every process the
    ``shared`` server has waited for (its per-grading servers, which waited for their
    workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    if shared is not None and shared.server is not None and shared.server.pid is not None:
        times = psutil.Process(shared.server.pid).cpu_times()
        cpu += times.children_user + times.children_system
    return cpu


def measure(
    submission: Path,
    half_cpu: bool,
    poll_s: float = 0.1,
    shared: SharedForkServer | None = None,
) -> dict[str, Any]:
    results = Path(tempfile.mkdtemp()) / "results.json"
    command = [sys.executable, "-m", "grader", "grade", str(submission), "--results", str(results)]
    if half_cpu:
        if not shutil.which("taskset"):
            raise SystemExit("--half-cpu needs taskset (util-linux)")
        command = ["taskset", "-c", "0", *command]
    loop = hog(0) if half_cpu else None
    before = children_cpu(shared)
    offer = shared.offer() if shared is not None else None
    try:
        start = time.perf_counter()
        with handing(offer, dict(os.environ)) as handed:
            child = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **handed
            )
        parent = psutil.Process(child.pid)
        peak_rss = peak_pss = 0
        while child.poll() is None:
            if poll_s > 0:
                rss, pss = tree_memory(parent)
                peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            time.sleep(poll_s or 0.1)
        seconds = time.perf_counter() - start
        if offer is not None:  # its server ends with the grading, reaped by the shared one
            with contextlib.suppress(psutil.Error):
                psutil.Process(offer.pid).wait(timeout=10)
        after = children_cpu(shared)
        data = json.loads(results.read_text())
    finally:
        if loop is not None:
            loop.kill()
            loop.wait()
        shutil.rmtree(results.parent, ignore_errors=True)
    benchmarks = data.get("extra_data", {}).get("benchmarks", {})
    cpu = after - before
    return {
        "seconds": seconds,
        # User + system CPU seconds of the grader and every process it and its children
        # waited for (the fork server, the workers): what the grading cost the machine.
        "cpu_seconds": cpu,
        "peak_rss_mib": peak_rss / 2**20,
        "peak_pss_mib": peak_pss / 2**20,
        "score": data["score"],
        "failed": [
            (t["number"], t.get("output", "")) for t in data["tests"] if t["status"] != "passed"
        ],
        "confirmed": sorted(n for n, b in benchmarks.items() if b.get("extra_rounds")),
        "timed_runs": stalled_runs(benchmarks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submission", nargs="?", default=str(ROOT / "solution"))
    parser.add_argument("--half-cpu", action="store_true")
    parser.add_argument("--runs", type=int, default=1, help="gradings, one after another")
    parser.add_argument("--poll-ms", type=float, default=100.0, help="memory sampling; 0: none")
    parser.add_argument("--shared", action="store_true", help="as a class regrade grades")
    args = parser.parse_args(argv)
    if args.shared and args.half_cpu:  # the workers would fork from an unpinned server
        parser.error("--shared is a class regrade's way, --half-cpu Gradescope's: one or the other")
    cpu = "1/2 CPU (taskset + busy loop)" if args.half_cpu else "2 cores"
    if args.shared:
        cpu += ", workers forked from a shared fork server"
    shared = shared_server(device="cpu", parts=list(PARTS)) if args.shared else None
    try:
        return report(args, cpu, shared)
    finally:
        if shared is not None:
            shared.close()


def report(args: argparse.Namespace, cpu: str, shared: SharedForkServer | None) -> int:
    """Grade ``args.runs`` times and print each grading's figures, then their summary."""
    scores, confirmed, timed, stalled = [], 0, 0, 0
    for _ in range(args.runs):
        m = measure(Path(args.submission).resolve(), args.half_cpu, args.poll_ms / 1000, shared)
        memory = (
            f", peak memory {m['peak_pss_mib']:.0f} MiB PSS "
            f"({m['peak_rss_mib']:.0f} MiB RSS summed)"
            if args.poll_ms > 0
            else ""
        )
        extra = f", confirmation rounds in {', '.join(m['confirmed'])}" if m["confirmed"] else ""
        runs, slow = m["timed_runs"]
        spent = f" ({m['cpu_seconds']:.1f} CPU s)"
        print(
            f"graded {args.submission} on {cpu}: score {m['score']:g}, {m['seconds']:.1f} s"
            f"{spent}{memory}; {slow} of {runs} timed runs stalled by > 150 ms{extra}",
            flush=True,
        )
        for number, output in m["failed"]:
            print(f"  check {number} failed:\n    " + output.strip().replace("\n", "\n    "))
        scores.append(m["score"])
        confirmed += bool(m["confirmed"])
        timed, stalled = timed + runs, stalled + slow
    if args.runs > 1:
        best = max(scores)
        print(
            f"{args.runs} gradings: {scores.count(best)} scored {best:g} (lowest {min(scores):g}); "
            f"{confirmed} needed confirmation rounds; {stalled} of {timed} timed runs stalled "
            "by > 150 ms (slower than the fastest run of their variant)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
