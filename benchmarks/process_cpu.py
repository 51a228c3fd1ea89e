"""CPU time of every process a command starts, one line each.

    python benchmarks/process_cpu.py [--every-ms 50] -- COMMAND ...

Runs COMMAND and reads, every ``--every-ms`` milliseconds, the CPU time (user + system)
of it and of every process below it, with each one's owner and the end of its command
line. Prints, in the order they started, the processes that used more than 0.05 s, and
the total. A lower bound: a process's last interval before it exits is not seen, and one
that lives shorter than the interval may not be seen at all. Used to find where a
grading's CPU seconds go (the fork server's imports, the workers, the reference's
worker): ``python benchmarks/process_cpu.py -- python -m grader grade solution --parts part4``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import psutil


def watch(command: list[str], every_s: float, cwd: Path | None = None) -> tuple[dict, float, int]:
    """Run ``command`` (in ``cwd``); per process seen (pid, start time): CPU s, owner and
    command, parent, start relative to the command's; the wall time; the command's pid."""
    started = time.time()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    root = psutil.Process(proc.pid)
    seen: dict[tuple[int, float], tuple[float, str, int, float]] = {}
    while proc.poll() is None:
        try:
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in processes:
            try:
                with p.oneshot():
                    cpu, key = p.cpu_times(), (p.pid, p.create_time())
                    what = f"{p.username()[:10]} {' '.join(p.cmdline())[-90:]}"
                    if key in seen and not what.split(" ", 1)[1]:  # exiting: keep its name
                        what = seen[key][1]
                    seen[key] = (cpu.user + cpu.system, what, p.ppid(), p.create_time() - started)
            except psutil.Error:
                pass
        time.sleep(every_s)
    return seen, time.time() - started, proc.pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every-ms", type=float, default=50.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    seen, wall, _ = watch(command, args.every_ms / 1000)
    for (pid, _), (cpu, what, parent, start) in sorted(seen.items(), key=lambda kv: kv[1][3]):
        if cpu > 0.05:
            print(f"{pid:7d} parent {parent:7d} start {start:5.1f} s  cpu {cpu:6.2f} s  {what}")
    total = sum(v[0] for v in seen.values())
    print(f"total CPU {total:.2f} s (a lower bound), wall {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
