"""Calibration: proposals from measured ratios, the cache-free baseline, one real run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grader import cli
from grader.core.thresholds import load_thresholds
from grader.ta.calibrate import (
    BASELINES,
    EXTRA_BASELINES,
    Observation,
    baseline_sets,
    cache_free_submission,
    main,
    pool_gradings,
    propose,
    toml_snippet,
)
from grader.ta.mutants import load_mutants
from tests.conftest import Graded


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
    proposals = main(device="cpu", parts=["part2"], runs=1)
    assert set(proposals) == {"part2.min_speedup", "part2.max_vs_reference"}
    p = proposals["part2.min_speedup"]
    assert p.separates
    out = capsys.readouterr().out
    assert "[cpu.part2]" in out and f"min_speedup = {p.threshold:g}" in out
    # The yardstick too: the reference near 1x its own runs, the cache-free baseline far.
    yardstick = proposals["part2.max_vs_reference"]
    assert yardstick.separates and f"max_vs_reference = {yardstick.threshold:g}" in out


# --------------------------------------------------------------- proposals from results files


def grading(profile: str, medians: dict[str, float], limit: float = 9.9) -> dict:
    """A results file's data as ``grade`` writes it, reduced to what calibration reads:
    one benchmark record per part, one criterion per key, its ratio's median."""
    records: dict[str, dict] = {}
    for key, median in medians.items():
        record = records.setdefault(key.split(".")[0], {"criteria": []})
        ratio = {"median": median, "low": median, "high": median}
        at_least = ".min_" in key
        record["criteria"].append(
            {"key": key, "label": key, "at_least": at_least, "limit": limit, "ratio": ratio}
        )
    return {"tests": [], "extra_data": {"benchmark_profile": profile, "benchmarks": records}}


def test_a_real_gradings_results_pool_on_the_reference_side(solution_graded: Graded) -> None:
    benchmarks = solution_graded.file["extra_data"]["benchmarks"]
    profile, observations, unjudged = pool_gradings([solution_graded.file], [])
    assert unjudged == []
    assert profile == solution_graded.file["extra_data"]["benchmark_profile"]
    expected: dict[str, list[float]] = {}  # one threshold may judge each batch size
    for c in (c for record in benchmarks.values() for c in record["criteria"]):
        expected.setdefault(c["key"], []).append(c["ratio"]["median"])
    assert {k: o.reference for k, o in observations.items()} == expected
    assert all(o.baseline == [] for o in observations.values())


def test_pooled_gradings_are_proposed_from_as_a_calibration_would() -> None:
    reference = [grading("cuda", {"part3.min_speedup.8": r}) for r in (9.0, 12.0, 16.0)]
    baseline = [grading("cuda", {"part3.min_speedup.8": b}) for b in (1.0, 0.9)]
    baseline.append({"tests": [], "extra_data": {"benchmark_profile": "cuda", "benchmarks": {}}})
    profile, observations, _ = pool_gradings(reference, baseline)  # the cut-short adds nothing
    obs = observations["part3.min_speedup.8"]
    assert profile == "cuda" and obs.reference == [9.0, 12.0, 16.0] and obs.baseline == [1.0, 0.9]
    assert propose(obs).threshold == pytest.approx(3.0)
    # "now" is today's value in the thresholds file, not what the gradings were judged with
    assert obs.limit == load_thresholds("cuda")["part3"]["min_speedup"]["8"] != 9.9


def test_gradings_of_two_profiles_are_not_pooled() -> None:
    with pytest.raises(ValueError, match="several profiles"):
        pool_gradings([grading("cuda", {"part2.min_speedup": 9.0})],
                      [grading("cpu", {"part2.min_speedup": 1.0})])  # fmt: skip


def test_a_baseline_measured_where_the_reference_was_not_is_left_out() -> None:
    _, observations, _ = pool_gradings(
        [grading("cuda", {"part2.min_speedup": 9.0})],
        [grading("cuda", {"part2.min_speedup": 1.0, "part4.min_speedup": 1.0})],
    )
    assert set(observations) == {"part2.min_speedup"}


def test_a_criterion_the_profile_no_longer_sets_is_left_out_and_named() -> None:
    # The cuda profile judges no speedup at batch 1; older gradings measured one.
    assert "1" not in load_thresholds("cuda")["part3"]["min_speedup"]
    medians = {"part3.min_speedup.1": 3.0, "part3.min_speedup.8": 10.0}
    _, observations, unjudged = pool_gradings([grading("cuda", medians)], [])
    assert set(observations) == {"part3.min_speedup.8"} and unjudged == ["part3.min_speedup.1"]


def write(path: Path, data: object) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_calibrate_pools_results_files_from_the_command_line(tmp_path: Path, capsys) -> None:
    ref = [write(tmp_path / f"r{i}.json", grading("cuda", {"part4.min_speedup": r}))
           for i, r in enumerate((4.0, 3.0))]  # fmt: skip
    base = write(tmp_path / "b.json", grading("cuda", {"part4.min_speedup": 1.2}))
    out = tmp_path / "calibration.json"
    argv = ["calibrate", "--reference-results", *ref, "--baseline-results", base]
    assert cli.main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "over 2 reference and 1 baseline graded runs" in printed
    assert "[cuda.part4]\nmin_speedup = 1.9" in printed  # sqrt(3.0 * 1.2)
    assert json.loads(out.read_text())["observations"][0]["reference"] == [4.0, 3.0]


def test_calibrate_names_the_file_it_cannot_pool(tmp_path: Path, capsys) -> None:
    ref = write(tmp_path / "r.json", grading("cuda", {"part4.min_speedup": 4.0}))
    junk = write(tmp_path / "metadata.json", {"submission": 1})
    assert cli.main(["calibrate", "--reference-results", ref, junk]) == 2
    assert "metadata.json: no extra_data" in capsys.readouterr().err
    assert cli.main(["calibrate", "--baseline-results", ref]) == 2
    assert "--reference-results" in capsys.readouterr().err
    assert cli.main(["calibrate", "--reference-results", ref, "--parts", "part2"]) == 2
    assert "no benchmark measurement of part2" in capsys.readouterr().err
