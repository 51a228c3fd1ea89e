"""Resource budget of a whole grading run, against Gradescope's defaults.

    python benchmarks/grading_budget.py [SUBMISSION] [--half-cpu]

Grades SUBMISSION (default: solution/) with ``python -m grader grade`` in a child
process and samples, every 20 ms, the memory of that process and every
process below it (the workers): the sum of RSS (counts shared pages once per
process, an upper bound) and, where readable, the sum of PSS (shared pages
split between processes; close to what a container's memory limit charges).
Prints the peaks and the wall time.

``--half-cpu`` simulates Gradescope's default ½ vCPU: the grading and a
busy loop are both pinned to CPU 0 with ``taskset``, so the grader gets about
half of one core.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


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


def measure(submission: Path, half_cpu: bool) -> dict[str, float]:
    results = Path(tempfile.mkdtemp()) / "results.json"
    command = [sys.executable, "-m", "grader", "grade", str(submission), "--results", str(results)]
    hog = None
    if half_cpu:
        if not shutil.which("taskset"):
            raise SystemExit("--half-cpu needs taskset (util-linux)")
        command = ["taskset", "-c", "0", *command]
        hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    start = time.perf_counter()
    child = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    parent = psutil.Process(child.pid)
    peak_rss = peak_pss = 0
    while child.poll() is None:
        rss, pss = tree_memory(parent)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    if hog is not None:
        hog.kill()
    data = json.loads(results.read_text())
    return {
        "seconds": seconds,
        "peak_rss_mib": peak_rss / 2**20,
        "peak_pss_mib": peak_pss / 2**20,
        "score": data["score"],
        "failed": [
            (t["number"], t.get("output", "")) for t in data["tests"] if t["status"] != "passed"
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submission", nargs="?", default=str(ROOT / "solution"))
    parser.add_argument("--half-cpu", action="store_true")
    args = parser.parse_args(argv)
    m = measure(Path(args.submission).resolve(), args.half_cpu)
    cpu = "1/2 CPU (taskset + busy loop)" if args.half_cpu else "2 cores"
    print(
        f"graded {args.submission} on {cpu}: score {m['score']:g}, {m['seconds']:.1f} s, "
        f"peak memory {m['peak_pss_mib']:.0f} MiB PSS ({m['peak_rss_mib']:.0f} MiB RSS summed)"
    )
    for number, output in m["failed"]:
        print(f"  check {number} failed:\n    " + output.strip().replace("\n", "\n    "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
