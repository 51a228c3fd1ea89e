"""Calibration of the work and growth probes (``[probes.<part>]``): the parts that have
them, every round timed, the proposals beside the benchmarks', one real run of Part 2."""

from __future__ import annotations

import importlib
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from grader.core.registry import PARTS
from grader.grading.suite import check_classes
from grader.judging.timed_pools import TimedPools
from grader.runtime.series import Sample
from grader.ta import calibrate
from grader.ta.calibrate import baseline_sets, cache_free_submission, propose
from grader.ta.calibrate_probes import (
    PROBE_LIMITS,
    PROBES_TABLE,
    probe_class,
    probe_parts,
    unjudged,
)
from tests.conftest import SOLUTION

PROBED = probe_parts(list(PARTS))
# A request's limit, all Part 3's growth runs read from the context.
CTX = SimpleNamespace(limits=SimpleNamespace(request_timeout_s=20.0))


def test_every_part_whose_checks_run_the_probes_has_their_limits() -> None:
    with_probes = {p for p in PARTS if any(issubclass(c, TimedPools) for c in check_classes(p))}
    assert with_probes and set(PROBED) == with_probes
    for part in PROBED:
        cls = probe_class(part)
        assert cls.work_probe is not TimedPools.work_probe
        assert cls.growth_probe is not TimedPools.growth_probe


def timed_runs(probe: TimedPools) -> list[tuple[bool, int]]:
    """Fake the probe's timed generate (no worker): a cached run costs new tokens cubed,
    a cache-free one a hundred times that, far past any limit on either side. Returns
    the list that records each run as (cached, new tokens)."""
    runs: list[tuple[bool, int]] = []

    def generate(model: str, pool: str, shape: tuple[int, int, int], cache: Any, *a, **k):
        cached = cache is not False  # None: use_cache left at its default
        runs.append((cached, shape[2]))
        return Sample(seconds=1.0, cpu_seconds=shape[2] ** 3 * (1 if cached else 100))

    probe.timed_generate = generate  # type: ignore[method-assign]
    probe.ensure_model = lambda *a, **k: None  # type: ignore[attr-defined]
    return runs


def judged(cls: type[TimedPools]) -> TimedPools:
    """The check as the grading binds it: its probes judged against their limits."""
    probe = type(cls.__name__, (cls,), {"ctx": CTX, "runTest": lambda self: None})()
    probe.setUp()
    return probe


@pytest.mark.parametrize("part", PROBED)
def test_unjudged_probes_time_and_count_every_round(part: str) -> None:
    cases = importlib.import_module(f"grader.parts.{part}.cases")
    probe = unjudged(probe_class(part), CTX)
    runs = timed_runs(probe)
    work, _ = probe.work_probe()
    assert len(runs) == 2 * cases.WORK_ROUNDS and work.runs == cases.WORK_ROUNDS
    del runs[:]
    growth = probe.growth_probe()
    assert len(runs) == 2 * cases.GROWTH_ROUNDS and growth.runs == cases.GROWTH_ROUNDS
    # Graded, the same far-off ratios decide in the first round: calibration needs them all.
    graded = judged(probe_class(part))
    early = timed_runs(graded)
    graded.work_probe()
    graded.growth_probe()
    assert len(early) == 4


def fake_probe_gradings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, list[str]]]:
    """Gradings without a grader: no benchmark measured, and each probe grading's ratios
    a cache's for the reference and a cache-free design's for any other submission.
    Returns the probe gradings asked for, as (the reference's, parts)."""
    import grader.grading.runner as runner

    asked: list[tuple[bool, list[str]]] = []

    def probe_grading(submission: Path, parts: list[str]) -> dict[str, float]:
        reference = Path(submission) == calibrate.SOLUTION
        asked.append((reference, parts))
        cache = {"min_work_ratio": 8.0, "max_cached_growth": 1.1}
        cache_free = {"min_work_ratio": 1.1, "max_cached_growth": 6.0}
        return {f"{p}.{n}": (cache if reference else cache_free)[n] for p in parts for n in cache}

    monkeypatch.setattr(runner, "grade", lambda *a, **k: SimpleNamespace(extra_data={}))
    monkeypatch.setattr(calibrate, "probe_grading", probe_grading)
    return asked


def test_calibrate_measures_the_probes_and_proposes_their_limits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = fake_probe_gradings(monkeypatch)
    parts = list(calibrate.BENCHMARK_PARTS)
    proposals = calibrate.main(device="cpu", parts=parts, runs=2, json_out=tmp_path / "c.json")
    # The reference, then every baseline submission that has a probed part, twice each.
    sets = [s for s, _ in baseline_sets(parts) if set(s) & set(PROBED)]
    assert asked == [(True, PROBED)] * 2 + [
        (False, [p for p in s if p in PROBED]) for s in sets for _ in range(2)
    ]
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "c.json").read_text())
    keys = {p["key"] for p in saved["proposals"]}
    for part in PROBED:
        assert f"[{PROBES_TABLE}.{part}]" in out
        for name, (_, at_least) in PROBE_LIMITS.items():
            prop = proposals[f"{PROBES_TABLE}.{part}.{name}"]
            assert prop.key in keys and prop.separates
            assert f"{name} = {prop.threshold:g}" in out
            low, high = (1.1, 8.0) if at_least else (1.1, 6.0)
            assert prop.threshold == pytest.approx(math.sqrt(low * high), abs=0.01)


def test_no_probes_measures_the_benchmarks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_probe_gradings(monkeypatch)
    proposals = calibrate.main(device="cpu", parts=["part2"], runs=1, probes=False)
    assert asked == [] and not any(k.startswith(f"{PROBES_TABLE}.") for k in proposals)


@pytest.mark.grading
def test_the_probes_tell_the_reference_from_the_cache_free_design() -> None:
    """One real probe grading of each on Part 2: the reference's cache and its disguised
    cache-free baseline lie on either side of a proposed limit, for both probes."""
    observations: dict[str, calibrate.Observation] = {}
    calibrate.measure_probes(SOLUTION, ["part2"], 1, "reference", observations)
    baseline = cache_free_submission(["part2"])
    try:
        calibrate.measure_probes(baseline, ["part2"], 1, "baseline", observations)
    finally:
        shutil.rmtree(baseline, ignore_errors=True)
    assert set(observations) == {f"{PROBES_TABLE}.part2.{name}" for name in PROBE_LIMITS}
    for obs in observations.values():
        assert len(obs.reference) == len(obs.baseline) == 1
        assert propose(obs).separates, obs
