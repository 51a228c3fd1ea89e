"""Where one grading's CPU seconds go: by process, and by check.

    python benchmarks/cost_breakdown.py [SUBMISSION] [--parts part3,...] [--every-ms 100]
                                        [--json FILE]
    python benchmarks/cost_breakdown.py --trace results/gpu-cost/trace_alone.jsonl

Grades SUBMISSION (default: ``solution/``) once with ``python -m grader grade``, every
worker request traced (``KVGRADER_TRACE``: the check that asked, whose worker and its
pid, timed or not) and every process below the grader sampled
(``benchmarks/process_cpu.py``). Prints

* the CPU seconds of each role: the grader itself; its fork server (the libraries it
  imports once for every worker); the reference's workers (the yardstick's runs); the
  submission's workers, and anything they started. A worker's role is read from the
  trace by its pid, so it holds on a machine with no worker account too;
* per check, the requests it made: how many, the seconds of the submission's untimed
  ones (wall time: what the check waits for), and the CPU seconds the grader read for
  the timed runs of the submission and of the reference. A class's set-up runs before
  its first check starts: its requests count in the check before.

With ``--trace``, nothing is graded: a trace written elsewhere (``benchmarks/gpu_cost.sh``
on a lent GPU) is read, and its requests' wall seconds are shown by phase (worker
starts, model builds, the timed runs and the other requests of each side), with each
part's reference workers and model builds, then the per-check table.

The roles' figures are sampled, so each is a lower bound, short by up to ``--every-ms``
for each process (its last interval before it exits); the total is exact (every process
of the grading is reaped, in the end, by the grader, this command's child), and what the
sampling missed is shown beside it. Sample no faster than the default: walking every
process's ``/proc`` entries each 20 ms stalled timed runs enough to send check 4.6 into
its confirmation rounds. Used to find what a cheaper grading must remove
(``docs/measurements/2026-11-28-cost-floor.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from process_cpu import watch  # noqa: E402

ROLES = ("grader", "fork server", "reference workers", "submission workers", "untraced")
#: What a process of a sampled grading is, as ``watch`` saw it: CPU seconds, owner and the
#: end of its command line, parent pid, start (s).
Seen = dict[tuple[int, float], tuple[float, str, int, float]]


@dataclass
class CheckCost:
    """The worker requests one check made, and what they cost."""

    check: str
    requests: int = 0
    untimed_s: float = 0.0  # the submission's untimed requests, wall seconds
    timed_cpu_s: float = 0.0  # the submission's timed runs, CPU seconds read by the grader
    reference_cpu_s: float = 0.0  # the reference's timed runs, likewise


def role_seconds(seen: Seen, grader_pid: int, rows: list[dict[str, Any]]) -> dict[str, float]:
    """CPU seconds per role (``ROLES``) of the processes ``seen``. The grader is
    ``grader_pid``, with any helper it starts; the fork server, its child whose command
    names it. A worker is the reference's or the submission's as the trace ``rows`` name
    its pid, and what it starts counts with it. Anything else below the server (a worker
    that answered no request) is untraced."""
    trusted = {r["pid"]: bool(r["trusted"]) for r in rows if r.get("pid") is not None}
    parent = {pid: ppid for (pid, _), (_, _, ppid, _) in seen.items()}
    what = {pid: text for (pid, _), (_, text, _, _) in seen.items()}

    def role(pid: int) -> str:
        start = pid
        for _ in range(64):  # up the tree to a worker, the server or the grader
            if pid in trusted:
                return "reference workers" if trusted[pid] else "submission workers"
            if pid == grader_pid:
                return "grader"
            if parent.get(pid) == grader_pid and "forkserver" in what.get(pid, ""):
                return "fork server" if pid == start else "untraced"
            if pid not in parent:
                break
            pid = parent[pid]
        return "untraced"

    totals = dict.fromkeys(ROLES, 0.0)
    for (pid, _), (cpu, _, _, _) in seen.items():
        totals[role(pid)] += cpu
    return totals


def check_costs(rows: list[dict[str, Any]]) -> list[CheckCost]:
    """Per check named in the trace ``rows``, in the order the checks first asked."""
    costs: dict[str, CheckCost] = {}
    for row in rows:
        cost = costs.setdefault(str(row.get("check")), CheckCost(str(row.get("check"))))
        cost.requests += 1
        if row.get("timed"):
            cpu = row.get("cpu_s") or 0.0
            if row.get("trusted"):
                cost.reference_cpu_s += cpu
            else:
                cost.timed_cpu_s += cpu
        elif not row.get("trusted"):
            cost.untimed_s += row.get("seconds") or 0.0
    return list(costs.values())


#: The phases of a grading's requests, read from its trace alone (a GPU grading's, where
#: the wall time is what counts).
PHASES = (
    "worker starts",
    "model builds",
    "submission timed",
    "reference timed",
    "submission other",
    "reference other",
)


def phase_seconds(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Wall seconds per phase (``PHASES``) of a trace's requests, and per part the
    reference's workers (distinct pids) and its model builds: where a GPU grading's time
    goes without sampling its processes."""
    totals = dict.fromkeys(PHASES, 0.0)
    workers: dict[str, set[int]] = defaultdict(set)
    builds: dict[str, int] = defaultdict(int)
    for row in rows:
        whose = "reference" if row.get("trusted") else "submission"
        totals["worker starts"] += row.get("start_s") or 0.0
        seconds = row.get("seconds") or 0.0
        if row.get("op") in ("build", "load"):
            totals["model builds"] += seconds
            if row.get("trusted"):
                builds[row["part"]] += 1
        else:
            totals[f"{whose} {'timed' if row.get('timed') else 'other'}"] += seconds
        if row.get("trusted") and row.get("pid") is not None:
            workers[row["part"]].add(row["pid"])
    reference = {p: {"workers": len(workers[p]), "builds": builds[p]} for p in sorted(workers)}
    return {"seconds": {k: round(v, 2) for k, v in totals.items()}, "reference": reference}


def part_of(check: str) -> str:
    return f"part{check.split('.')[0]}" if check[:1].isdigit() else "-"


def roles_table(roles: dict[str, float], wall_s: float, cpu_s: float) -> str:
    """The CPU seconds of each role, what the sampling missed and the exact total."""
    lines = [f"CPU seconds by process (sampled, each a lower bound), wall {wall_s:.1f} s:"]
    lines += [f"  {name:20s} {roles[name]:6.2f}" for name in ROLES]
    lines.append(f"  {'not sampled':20s} {max(0.0, cpu_s - sum(roles.values())):6.2f}")
    lines.append(f"  {'total (exact)':20s} {cpu_s:6.2f}")
    return "\n".join(lines)


def checks_table(checks: list[CheckCost]) -> str:
    """One line per check, then one per part."""
    lines = [
        f"{'check':>6} {'requests':>8} {'untimed s':>10} {'timed CPU s':>12} {'reference':>10}"
    ]
    parts: dict[str, CheckCost] = defaultdict(lambda: CheckCost("all"))
    for c in checks:
        total = parts[part_of(c.check)]
        total.requests += c.requests
        total.untimed_s += c.untimed_s
        total.timed_cpu_s += c.timed_cpu_s
        total.reference_cpu_s += c.reference_cpu_s
    for name, c in [*((c.check, c) for c in checks), *sorted(parts.items())]:
        lines.append(
            f"{name:>6} {c.requests:8d} {c.untimed_s:10.2f} {c.timed_cpu_s:12.2f} "
            f"{c.reference_cpu_s:10.2f}"
        )
    return "\n".join(lines)


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The lines of a ``KVGRADER_TRACE`` file (none where it was never written)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def children_cpu() -> float:
    """CPU seconds (user + system) of every child this process has reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(submission: Path, parts: str, every_s: float) -> dict[str, Any]:
    """Grade ``submission`` once, sampled and traced; the figures."""
    with tempfile.TemporaryDirectory(prefix="cost-") as scratch:
        trace_file = Path(scratch) / "trace.jsonl"
        command = [sys.executable, "-m", "grader", "grade", str(submission)]
        command += ["--results", str(Path(scratch) / "results.json")]
        command += ["--parts", parts] if parts else []
        os.environ["KVGRADER_TRACE"] = str(trace_file)
        before = children_cpu()
        try:
            seen, wall, grader_pid = watch(command, every_s, cwd=ROOT)
        finally:
            del os.environ["KVGRADER_TRACE"]
        cpu = children_cpu() - before
        rows = read_trace(trace_file)
        score = json.loads((Path(scratch) / "results.json").read_text()).get("score")
    return {
        "submission": str(submission),
        "score": score,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "roles": {k: round(v, 2) for k, v in role_seconds(seen, grader_pid, rows).items()},
        "checks": [asdict(c) for c in check_costs(rows)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("submission", nargs="?", default=str(ROOT / "solution"))
    parser.add_argument("--parts", default="", help="comma-separated (default: every part)")
    parser.add_argument("--every-ms", type=float, default=100.0)
    parser.add_argument("--json", dest="json_out", default="", help="also write the figures")
    parser.add_argument(
        "--trace", default="", help="read this KVGRADER_TRACE file instead of grading"
    )
    args = parser.parse_args(argv)
    if args.trace:
        rows = read_trace(Path(args.trace))
        phases = phase_seconds(rows)
        print("Wall seconds of the traced requests, by phase:")
        print("\n".join(f"  {k:20s} {v:8.2f}" for k, v in phases["seconds"].items()))
        for part, seen in phases["reference"].items():
            print(f"  {part}: {seen['workers']} reference worker(s), {seen['builds']} build(s)")
        print(checks_table(check_costs(rows)))
        return 0
    figures = measure(Path(args.submission).resolve(), args.parts, args.every_ms / 1000)
    checks = [CheckCost(**c) for c in figures["checks"]]
    print(f"graded {figures['submission']}: score {figures['score']}")
    print(roles_table(figures["roles"], figures["wall_s"], figures["cpu_s"]))
    print()
    print(checks_table(checks))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
