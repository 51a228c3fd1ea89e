"""Calibration from results files of gradings already made: pooled medians, today's
values, the verdicts re-judged, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader import cli
from grader.core.thresholds import load_thresholds
from grader.ta.calibrate import propose
from grader.ta.pooled import describe_verdicts, judged_again, pool_gradings, verdict_counts
from tests.conftest import Graded


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
    with pytest.raises(ValueError, match=r"several profiles \(cpu, cuda\)"):
        pool_gradings([grading("cuda", {"part2.min_speedup": 9.0})],
                      [grading("cpu", {"part2.min_speedup": 1.0})])  # fmt: skip
    with pytest.raises(ValueError, match="names no benchmark profile"):
        pool_gradings([grading("", {"part2.min_speedup": 9.0})], [])
    with pytest.raises(ValueError, match="no 'tpu' profile"):
        pool_gradings([grading("tpu", {"part2.min_speedup": 9.0})], [])
    with pytest.raises(ValueError, match="judges none of the criteria"):
        pool_gradings([grading("cuda", {"part3.min_speedup.1": 9.0})], [])


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


def test_a_grading_is_judged_again_on_its_medians_with_todays_values() -> None:
    limits = {"part4": {"max_cached_growth": 1.5, "min_speedup": 2.0}}
    passing = grading("cuda", {"part4.max_cached_growth": 1.1, "part4.min_speedup": 3.0})
    growing = grading("cuda", {"part4.max_cached_growth": 2.5, "part4.min_speedup": 3.0})
    [record] = passing["extra_data"]["benchmarks"].values()
    assert judged_again(record, limits) is True
    assert judged_again(next(iter(growing["extra_data"]["benchmarks"].values())), limits) is False
    assert judged_again(record, {"part4": {}}) is None  # a profile that judges none of it
    counts = verdict_counts([passing, growing, passing], limits)
    assert counts == {"part4": (2, 3)}
    assert describe_verdicts(counts, {"part4": (0, 2)}) == (
        "With today's values the reference passes part4 in 2 of 3.\n"
        "The baselines fail part4 in 2 of 2."
    )


def test_a_real_gradings_verdicts_are_judged_as_the_grading_judged_them(
    solution_graded: Graded,
) -> None:
    limits = load_thresholds(solution_graded.file["extra_data"]["benchmark_profile"])
    for check, record in solution_graded.file["extra_data"]["benchmarks"].items():
        assert judged_again(record, limits) is record["passed"] is True, check


def test_a_ratio_that_is_not_a_number_is_judged_failed_and_proposes_nothing() -> None:
    nan, inf = float("nan"), float("inf")
    reference = [grading("cuda", {"part2.min_speedup": r}) for r in (9.0, nan, inf)]
    _, observations, _ = pool_gradings(reference, [grading("cuda", {"part2.min_speedup": 1.0})])
    assert observations["part2.min_speedup"].reference == [9.0]
    assert propose(observations["part2.min_speedup"]).threshold == pytest.approx(3.0)
    limits = load_thresholds("cuda")
    assert verdict_counts(reference[:2], limits) == {"part2": (1, 2)}  # NaN: not passed


def test_the_report_counts_the_gradings_each_criterion_has(tmp_path: Path, capsys) -> None:
    ref = [write(tmp_path / "r1.json", grading("cuda", {"part2.min_speedup": 9.0})),
           write(tmp_path / "r2.json", grading("cuda", {"part2.min_speedup": 8.0,
                                                       "part4.min_speedup": 3.0}))]  # fmt: skip
    assert cli.main(["calibrate", "--reference-results", *ref]) == 0
    assert "over 1-2 reference and 0 baseline graded runs" in capsys.readouterr().out
