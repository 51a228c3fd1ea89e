"""``python -m grader calibrate --reference-results ... --baseline-results ...``: a
calibration from gradings already made, grading nothing.

The benchmark medians of results files written before (``grade --tags benchmark`` of
the reference and of the cache-free designs, all judged with one profile) are pooled,
each grading counted once, and proposed from as :func:`grader.ta.calibrate.propose`
does. Short loans of a GPU, weeks apart, and a cluster's jobs thus add up to one
calibration. The report also re-judges every grading with today's values: how many of
the reference's gradings each benchmark check would pass, and how many of the
baselines' it would fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grader.core.thresholds import load_thresholds, parse_thresholds, thresholds_text
from grader.runtime.timing import Criterion, Ratio
from grader.ta.calibrate import DEFAULT_MARGIN, Observation, Proposal, collect, conclude


def read_gradings(paths: list[Path]) -> list[dict[str, Any]]:
    """The results files of gradings already made, each checked to be one of ``grade``'s."""
    gradings = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable results file ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("extra_data"), dict):
            raise ValueError(f"{path}: no extra_data; not a results file written by grade")
        gradings.append(data)
    return gradings


def current_limit(limits: dict[str, Any], key: str) -> float | None:
    """The value of criterion ``key`` (e.g. ``part3.min_speedup.8``) in a profile's table."""
    value: Any = limits
    for name in key.split("."):
        if not isinstance(value, dict) or name not in value:
            return None
        value = value[name]
    return float(value) if isinstance(value, (int, float)) else None


def pool_gradings(
    reference: list[dict[str, Any]], baseline: list[dict[str, Any]]
) -> tuple[str, dict[str, Observation], list[str]]:
    """Each grading's benchmark medians on its side, so that gradings made apart (short
    loans of a GPU, other sessions, a cluster's jobs) add up to one calibration.

    All of them must have been judged with one threshold profile, as ratios of another
    profile's workloads do not compare. A grading without a benchmark verdict (cut short,
    or a crash) adds nothing. The "now" column is the profile's value in the thresholds
    file today, whatever the gradings were judged against; a criterion the profile no
    longer sets is left out and named (the third value returned).
    """
    profiles = {g["extra_data"].get("benchmark_profile") or "" for g in reference + baseline}
    if "" in profiles:
        raise ValueError("a grading names no benchmark profile (extra_data.benchmark_profile)")
    if len(profiles) != 1:
        named = ", ".join(sorted(profiles))
        raise ValueError(f"the gradings were judged with several profiles ({named}); pool one")
    profile = profiles.pop()
    limits = parse_thresholds(thresholds_text()).get(profile)
    if limits is None:
        raise ValueError(f"the thresholds file has no {profile!r} profile")
    observations: dict[str, Observation] = {}
    for side, gradings in (("reference", reference), ("baseline", baseline)):
        for grading in gradings:
            collect(observations, grading["extra_data"].get("benchmarks") or {}, side)
    observations = {k: o for k, o in observations.items() if o.reference}
    if not observations:
        raise ValueError("none of the reference's gradings holds a benchmark measurement")
    unjudged = [key for key in observations if current_limit(limits, key) is None]
    for key in unjudged:
        del observations[key]
    if not observations:
        raise ValueError(f"the {profile} profile judges none of the criteria measured")
    for obs in observations.values():
        obs.limit = current_limit(limits, obs.key) or obs.limit
    return profile, observations, unjudged


def judged_again(record: dict[str, Any], limits: dict[str, Any]) -> bool | None:
    """Whether one graded benchmark record (``extra_data["benchmarks"][check]``) meets
    ``limits`` (a profile's tables) on its medians; None when the profile judges none of
    its criteria. Its confirmation rounds are in the medians already: a record that
    missed at first is judged on all its runs, as the grading judged it."""
    met = []
    for c in record.get("criteria", []):
        limit = current_limit(limits, c["key"])
        if limit is not None:
            ratio = Ratio(**c["ratio"])
            met.append(Criterion(c["key"], c["label"], ratio, limit, c["at_least"]).passed)
    return all(met) if met else None


def verdict_counts(
    gradings: list[dict[str, Any]], limits: dict[str, Any]
) -> dict[str, tuple[int, int]]:
    """Per benchmark check: (gradings it passes with ``limits``, gradings that timed it)."""
    counts: dict[str, list[int]] = {}
    for grading in gradings:
        for check, record in (grading["extra_data"].get("benchmarks") or {}).items():
            verdict = judged_again(record, limits)
            if verdict is not None:
                tally = counts.setdefault(check, [0, 0])
                tally[0] += verdict
                tally[1] += 1
    return {check: (passed, total) for check, (passed, total) in sorted(counts.items())}


def describe_verdicts(
    reference: dict[str, tuple[int, int]], baseline: dict[str, tuple[int, int]]
) -> str:
    """One line per side: how the gradings fare with today's values."""
    ref = ", ".join(f"{c} in {p} of {n}" for c, (p, n) in reference.items())
    lines = [f"With today's values the reference passes {ref or 'nothing'}."]
    if baseline:
        base = ", ".join(f"{c} in {n - p} of {n}" for c, (p, n) in baseline.items())
        lines.append(f"The baselines fail {base}.")
    return "\n".join(lines)


def counted(observations: dict[str, Observation], side: str) -> str:
    """How many gradings of ``side`` each criterion has: ``6``, or ``4-6`` where the
    criteria differ (each part graded apart)."""
    counts = [len(getattr(o, side)) for o in observations.values()]
    low, high = min(counts), max(counts)
    return str(high) if low == high else f"{low}-{high}"


def main_from_results(
    *,
    reference: list[Path],
    baseline: list[Path],
    parts: list[str] | None = None,
    margin: float = DEFAULT_MARGIN,
    json_out: Path | None = None,
) -> dict[str, Proposal]:
    """Propose thresholds from the results files of gradings already made (``grade
    --tags benchmark`` of the reference and of cache-free designs), grading nothing."""
    gradings = read_gradings(reference), read_gradings(baseline)
    profile, observations, unjudged = pool_gradings(*gradings)
    for key in unjudged:
        print(f"{key}: measured, but the {profile} profile sets no such threshold now; left out")
    if parts:
        observations = {k: o for k, o in observations.items() if k.split(".")[0] in parts}
        if not observations:
            raise ValueError(f"the gradings hold no benchmark measurement of {', '.join(parts)}")
    runs = f"{counted(observations, 'reference')} reference and "
    runs += f"{counted(observations, 'baseline')} baseline"
    proposals = conclude(observations, margin, profile, runs, json_out)
    limits = load_thresholds(profile)
    print(describe_verdicts(*(verdict_counts(g, limits) for g in gradings)))
    return proposals
