"""Calibration: proposals from measured ratios, the cache-free baseline, one real run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader.runtime.timing import FULL_TIMING
from grader.ta import calibrate
from grader.ta.calibrate import (
    BASELINES,
    EXTRA_BASELINES,
    Observation,
    baseline_sets,
    cache_free_submission,
    main,
    propose,
    toml_snippet,
)
from grader.ta.mutants import load_mutants


def test_threshold_lies_midway_between_the_worst_runs() -> None:
    obs = Observation("part2.min_speedup", "speedup", True, 3.0, [16.0, 9.0, 12.0], [1.0, 0.9])
    p = propose(obs)
    assert p.threshold == pytest.approx(3.0)  # sqrt(9 * 1)
    assert p.margin_reference == p.margin_baseline == pytest.approx(3.0)


def test_an_at_most_threshold_points_the_other_way() -> None:
    obs = Observation("part4.max_cached_growth", "growth", False, 2.0, [0.8, 1.0], [4.0, 3.2])
    p = propose(obs)
    assert p.threshold == pytest.approx((1.0 * 3.2) ** 0.5, abs=0.01)
    assert p.separates


def test_an_unseparated_criterion_gets_the_stated_margin() -> None:
    obs = Observation("part4.min_no_cache_growth", "growth", True, 2.5, [3.0, 3.3], [3.1, 3.2])
    p = propose(obs, margin=1.5)
    assert p.threshold == pytest.approx(2.0)
    assert not p.separates and p.margin_reference == 1.5


def test_toml_snippet_nests_batch_sizes() -> None:
    proposals = {
        k: propose(Observation(k, k, True, 2.0, [4.0], [1.0]))
        for k in ("part3.min_speedup.1", "part3.min_speedup.8", "part2.min_speedup")
    }
    text = toml_snippet(proposals)
    assert '[<profile>.part3]\nmin_speedup = { "1" = 2, "8" = 2 }' in text
    assert "[<profile>.part2]\nmin_speedup = 2" in text


def test_baseline_applies_every_cache_free_mistake() -> None:
    root = cache_free_submission(list(BASELINES))
    try:
        for part, name in BASELINES.items():
            (mutant,) = [m for m in load_mutants(part) if m.name == name]
            for _, new in mutant.edits:
                assert new in (root / mutant.file).read_text()
    finally:
        shutil.rmtree(root)


def test_extra_baselines_are_measured_one_by_one_on_their_part() -> None:
    # The main baselines together first, then Part 3's last-logits-only design alone.
    sets = baseline_sets(["part2", "part3"])
    assert sets[0] == (["part2", "part3"], {})
    assert (["part3"], {"part3": "prefix_recomputed_last_logits_only"}) in sets
    assert len(sets) == 1 + sum(len(EXTRA_BASELINES.get(p, ())) for p in ("part2", "part3"))
    root = cache_free_submission(["part3"], {"part3": "prefix_recomputed_last_logits_only"})
    try:
        text = (root / "llama" / "generation.py").read_text()
        assert "self.output(self.norm(h[:, -1:]))" in text
        assert "prev_pos stays 0" not in text  # only the named baseline is applied
    finally:
        shutil.rmtree(root)


def test_part4_measures_the_cache_never_passed_back_as_a_baseline() -> None:
    name = "cache_never_passed_back_recomputes"
    assert (["part4"], {"part4": name}) in baseline_sets(["part4"])
    root = cache_free_submission(["part4"], {"part4": name})
    try:
        text = (root / "kv_lab.py").read_text()
        assert "out = model(ids, use_cache=True)" in text
    finally:
        shutil.rmtree(root)


def test_calibrating_part2_separates_reference_from_baseline(capsys) -> None:
    proposals = main(device="cpu", parts=["part2"], runs=1, probes=False)  # probes: their tests
    assert set(proposals) == {"part2.min_speedup", "part2.max_vs_reference"}
    p = proposals["part2.min_speedup"]
    assert p.separates
    out = capsys.readouterr().out
    assert "[cpu.part2]" in out and f"min_speedup = {p.threshold:g}" in out
    # The yardstick too: the reference near 1x its own runs, the cache-free baseline far.
    yardstick = proposals["part2.max_vs_reference"]
    assert yardstick.separates and f"max_vs_reference = {yardstick.threshold:g}" in out


def test_calibration_times_every_round_of_its_gradings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache-free baseline's calls lose its check in the first timed round; calibration
    still needs its ratios over every round, so its gradings time them all."""
    import grader.grading.runner as runner

    seen: list[str | None] = []

    def grade(*args, **kwargs) -> SimpleNamespace:
        seen.append(os.environ.get(FULL_TIMING))
        return SimpleNamespace(extra_data={"benchmarks": {}})

    monkeypatch.delenv(FULL_TIMING, raising=False)
    monkeypatch.setattr(runner, "grade", grade)
    calibrate.measure(Path("solution"), ["part2"], "cpu", 2, "baseline", {})
    assert seen == ["1", "1"] and FULL_TIMING not in os.environ
