"""``python -m grader calibrate``: measure the benchmark checks on this machine and propose
thresholds.

The benchmark checks (tag ``benchmark``) are graded, only them, several times on
the reference solution and on cache-free baselines: the solution with each
part's disguised cache-free mistake from the mutant library, which gives the
right outputs and recomputes the prefix at every step, and then each extra
baseline of a part alone (a cache-free design that skips work a plain
cache-free model does, so it comes closer to the reference). For every
threshold the command prints the ratios both sides produced (median and spread
over the runs; the baselines' runs pooled) and proposes the value that lies as
far from the reference's worst run as from the closest baseline run (their
geometric mean), with that margin stated. Where the
baseline cannot be told apart by a criterion (it checks the cache-free path
itself), the proposal is the reference's worst run divided by ``margin``.

The work and growth probes of checks 2.9 and 3.7 (``[probes.<part>]``, one table for
every device: they run on the CPU) are measured on the same submissions, in gradings of
their own that run the probes alone and time every round (:mod:`grader.ta.calibrate_probes`),
and proposed by the same rule.

With ``--reference-results`` (and ``--baseline-results``) nothing is graded: results
files written before are pooled instead (:mod:`grader.ta.pooled`); they hold no probe.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from grader.core.paths import PROJECT_ROOT, RESULTS, SOLUTION
from grader.core.registry import PARTS
from grader.core.thresholds import probe_thresholds
from grader.runtime.timing import FULL_TIMING
from grader.ta.calibrate_probes import PROBE_LIMITS, PROBES_TABLE, probe_grading, probe_parts
from grader.ta.mutants import load_mutants, materialise_all

if TYPE_CHECKING:
    from grader.ta.regrade.cluster import ClusterOptions

# Per benchmark part, the mutant that hides a cache-free implementation behind correct
# outputs, and the cache-free designs in disguise that come closer to the reference,
# measured one by one (``cache_free_baseline``, ``cache_free_extra`` of each part.toml).
BASELINES = {t: p.ta.cache_free_baseline for t, p in PARTS.items() if p.ta.cache_free_baseline}
EXTRA_BASELINES = {
    t: PARTS[t].ta.cache_free_extra for t in BASELINES if PARTS[t].ta.cache_free_extra
}
BENCHMARK_PARTS = tuple(BASELINES)
DEFAULT_MARGIN = 1.5


def cache_free_submission(parts: list[str], names: dict[str, str] | None = None) -> Path:
    """A temporary copy of the solution with a baseline mutant of every part of ``parts``
    applied: ``names[part]``, by default the part's main baseline."""
    names = {**BASELINES, **(names or {})}
    baselines = [m for p in parts for m in load_mutants(p) if m.name == names[p]]
    assert len(baselines) == len(parts), "a baseline mutant is missing from the library"
    return materialise_all(baselines, prefix="cache-free-")


def closer_designs(parts: list[str]) -> dict[str, str]:
    """The first extra baseline of each of ``parts`` that has one: with
    :func:`cache_free_submission`, the cache-free designs that come closest to the
    reference (the main baseline for a part without one)."""
    return {p: EXTRA_BASELINES[p][0] for p in parts if p in EXTRA_BASELINES}


def baseline_sets(parts: list[str]) -> list[tuple[list[str], dict[str, str]]]:
    """The baseline submissions to measure, as (parts, mutant name per part): every part's
    main baseline together, then each extra baseline on its own part."""
    sets = [(parts, {})]
    for part in parts:
        sets += [([part], {part: name}) for name in EXTRA_BASELINES.get(part, ())]
    return sets


@dataclass
class Observation:
    """One threshold's ratio, measured over several runs of two submissions."""

    key: str  # e.g. "part3.min_speedup.8" ([<profile>.part3]), "probes.part2.min_work_ratio"
    label: str
    at_least: bool
    limit: float  # the value in thresholds.toml now
    reference: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Proposal:
    key: str
    threshold: float
    margin_reference: float  # how far the reference's worst run is from the threshold
    margin_baseline: float | None  # the same for the baseline; None if it is not separated

    @property
    def separates(self) -> bool:
        return self.margin_baseline is not None


def collect(observations: dict[str, Observation], benchmarks: dict[str, Any], side: str) -> None:
    """Add the criteria of one graded run's ``extra_data["benchmarks"]`` to ``side``. A
    ratio that is not a finite number (a run timed as zero) says nothing to propose from
    and is left out; its check already failed, as every comparison with NaN does."""
    for record in benchmarks.values():
        for c in record["criteria"]:
            obs = observations.setdefault(
                c["key"], Observation(c["key"], c["label"], c["at_least"], c["limit"])
            )
            median = c["ratio"]["median"]
            if isinstance(median, (int, float)) and math.isfinite(median):
                getattr(obs, side).append(median)


def propose(obs: Observation, margin: float = DEFAULT_MARGIN) -> Proposal:
    """The threshold midway (geometrically) between the reference's and the baseline's
    worst runs; or, when the baseline is on the reference's side, ``margin`` inside
    the reference's worst run."""
    sign = 1 if obs.at_least else -1  # compare in the direction the criterion points
    ref_worst = min(obs.reference, key=lambda r: sign * r)
    base_worst = max(obs.baseline, key=lambda r: sign * r) if obs.baseline else None
    if base_worst is not None and sign * math.log(ref_worst / base_worst) > 0:
        threshold = math.sqrt(ref_worst * base_worst)
        gap = math.sqrt(max(ref_worst, base_worst) / min(ref_worst, base_worst))
        return Proposal(obs.key, round(threshold, 2), gap, gap)
    threshold = ref_worst / margin if obs.at_least else ref_worst * margin
    return Proposal(obs.key, round(threshold, 2), margin, None)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(
    observations: dict[str, Observation], proposals: dict[str, Proposal], runs: int | str
) -> str:
    """A table of what was measured and proposed, then the TOML to paste. ``runs``: how
    many graded runs each side had, or a phrase that says it."""
    head = f"{'threshold':<32} {'reference':>20} {'cache-free':>20} {'now':>6} {'proposed':>9}"
    lines = [f"Ratio medians over {runs} graded runs: median (lowest-highest)", head]
    for key, obs in observations.items():
        prop = proposals[key]
        sense = ">=" if obs.at_least else "<="
        lines.append(
            f"{key:<32} {spread(obs.reference):>20} {spread(obs.baseline):>20} "
            f"{obs.limit:>6g} {sense}{prop.threshold:>7g}"
        )
    lines.append("")
    for key, prop in proposals.items():
        if prop.separates:
            lines.append(
                f"{key}: margin x{prop.margin_reference:.2f} to the worst reference run and "
                f"to the worst cache-free run"
            )
        else:
            lines.append(
                f"{key}: the cache-free baseline is not told apart by this criterion; "
                f"margin x{prop.margin_reference:.2f} to the worst reference run"
            )
    return "\n".join(lines) + "\n\n" + toml_snippet(proposals)


def table_of(key: str) -> tuple[str, str, list[str]]:
    """Where criterion ``key`` lies in the thresholds file: its table (``<profile>.part3``
    for a benchmark's, the profile filled in by the caller; ``probes.part2`` for a probe's),
    its name and the batch size under it, if any."""
    head, *rest = key.split(".")
    if head == PROBES_TABLE:
        part, name, *rest = rest
        return f"{PROBES_TABLE}.{part}", name, rest
    name, *rest = rest
    return f"<profile>.{head}", name, rest


def toml_snippet(proposals: dict[str, Proposal]) -> str:
    """``[profile.partN]`` and ``[probes.partN]`` lines with the proposed values (tables
    of batch sizes inline)."""
    by_table: dict[str, dict[str, Any]] = {}
    for key, prop in proposals.items():
        part, name, rest = table_of(key)
        table = by_table.setdefault(part, {})
        if rest:
            table.setdefault(name, {})[rest[0]] = prop.threshold
        else:
            table[name] = prop.threshold
    out = []
    for part, values in by_table.items():
        out.append(f"[{part}]")
        for name, value in values.items():
            if isinstance(value, dict):
                inner = ", ".join(f'"{k}" = {v:g}' for k, v in value.items())
                out.append(f"{name} = {{ {inner} }}")
            else:
                out.append(f"{name} = {value:g}")
    return "\n".join(out)


def measure(
    submission: Path, parts: list[str], device: str, runs: int, side: str,
    observations: dict[str, Observation],
) -> None:  # fmt: skip
    """Grade only the benchmark checks of ``submission`` ``runs`` times, every round of
    each timed (``FULL_TIMING``): a cache-free baseline's calls lose its check early in a
    grading, but its ratios are what the thresholds are proposed from."""
    from grader.grading.runner import grade

    for i in range(runs):
        out = Path(tempfile.mkdtemp(prefix="calibrate-"))
        try:
            with mock.patch.dict(os.environ, {FULL_TIMING: "1"}):
                results = grade(
                    submission, results_path=out / "results.json", parts=parts, device=device,
                    tags=frozenset({"benchmark"}),
                )  # fmt: skip
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if results is None:
            raise RuntimeError(f"grading {submission} crashed during calibration")
        collect(observations, results.extra_data.get("benchmarks", {}), side)
        print(f"  {side} run {i + 1}/{runs} done", flush=True)


def measure_probes(
    submission: Path, parts: list[str], runs: int, side: str,
    observations: dict[str, Observation],
) -> None:  # fmt: skip
    """Run the work and growth probes of ``parts`` (those with ``[probes.<part>]``
    limits) on ``submission`` in ``runs`` gradings of their own, every round timed, and
    add each grading's medians to ``side`` under ``probes.<part>.<limit>``."""
    parts = probe_parts(parts)
    for i in range(runs):
        if not parts:
            return
        began = time.monotonic()
        for key, ratio in probe_grading(submission, parts).items():
            part, name = key.split(".")
            label, at_least = PROBE_LIMITS[name]
            limit = probe_thresholds(part)[name]
            obs = observations.setdefault(
                f"{PROBES_TABLE}.{key}",
                Observation(f"{PROBES_TABLE}.{key}", label, at_least, limit),
            )
            if math.isfinite(ratio):  # as collect(): a run timed as zero says nothing
                getattr(obs, side).append(ratio)
        took = time.monotonic() - began
        print(f"  {side} probes run {i + 1}/{runs} done ({took:.0f} s)", flush=True)


def main(
    *,
    device: str = "auto",
    parts: list[str] | None = None,
    runs: int = 5,
    margin: float = DEFAULT_MARGIN,
    json_out: Path | None = None,
    probes: bool = True,
) -> dict[str, Proposal]:
    """Measure the reference and the cache-free baselines (the benchmarks on ``device``,
    and unless ``probes`` is false the work and growth probes, on the CPU); print and
    return proposals."""
    from grader.core.thresholds import resolve_device

    device = resolve_device(device)
    parts = [p for p in (parts or list(PARTS)) if p in BASELINES]
    if not parts:
        raise ValueError(f"no benchmark checks in these parts (they are in {BENCHMARK_PARTS})")
    probed = probe_parts(parts) if probes else []
    observations: dict[str, Observation] = {}
    also = f", the probes of {', '.join(probed)} on the CPU" if probed else ""
    print(f"Calibrating the {device} profile on {', '.join(parts)}{also}: {runs} runs each")
    measure(SOLUTION, parts, device, runs, "reference", observations)
    measure_probes(SOLUTION, probed, runs, "reference", observations)
    for subset, names in baseline_sets(parts):
        baseline = cache_free_submission(subset, names)
        if names:
            print(f"Extra baseline: {', '.join(names.values())}")
        try:
            measure(baseline, subset, device, runs, "baseline", observations)
            measure_probes(baseline, [p for p in subset if p in probed], runs, "baseline",
                           observations)  # fmt: skip
        finally:
            shutil.rmtree(baseline, ignore_errors=True)
    return conclude(observations, margin, device, runs, json_out)


def conclude(
    observations: dict[str, Observation], margin: float, profile: str, runs: int | str,
    json_out: Path | None,
) -> dict[str, Proposal]:  # fmt: skip
    """Propose every threshold, print the report, and write the measurements if asked."""
    proposals = {key: propose(obs, margin) for key, obs in observations.items()}
    print(report(observations, proposals, runs).replace("<profile>", profile))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": profile,
            "runs": runs,
            "observations": [asdict(o) for o in observations.values()],
            "proposals": [asdict(p) for p in proposals.values()],
        }
        json_out.write_text(json.dumps(payload, indent=2) + "\n")
    return proposals


def main_on_cluster(
    *,
    cluster: ClusterOptions,
    device: str = "cuda",
    parts: list[str] | None = None,
    runs: int = 5,
    margin: float = DEFAULT_MARGIN,
    json_out: Path | None = None,
    probes: bool = True,
) -> int:
    """The same calibration as :func:`main`, run as one cluster job (``--executor slurm``
    or ``submitit-local``) so that a profile is calibrated on the GPUs that will grade.

    The job runs ``python -m grader calibrate`` with these arguments on the node; its
    report is printed here when it ends, and the measurements are written to
    ``json_out`` (default ``results/calibration-<device>.json``) on the shared file system.
    """
    from grader.ta.regrade.cluster import run_command_job

    json_out = (json_out or RESULTS / f"calibration-{device}.json").resolve()
    command = [
        sys.executable, "-m", "grader", "calibrate", "--device", device,
        "--parts", ",".join(parts or []), "--runs", str(runs), "--margin", str(margin),
        "--json", str(json_out), *([] if probes else ["--no-probes"]),
    ]  # fmt: skip
    log_dir = cluster.log_dir or RESULTS / "cluster" / "calibrate"
    code = run_command_job(command, cluster, log_dir=log_dir, cwd=PROJECT_ROOT)
    print(f"measurements: {json_out}" if code == 0 else f"calibration failed (exit {code})")
    return code
