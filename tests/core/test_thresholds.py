"""The benchmark thresholds file: validated, one profile per device."""

from __future__ import annotations

import json
import re
from importlib import resources

import jsonschema
import pytest

from grader.core.thresholds import (
    THRESHOLDS_FILE,
    leaderboard_entries,
    leaderboard_settings,
    load_thresholds,
    parse_thresholds,
    probe_thresholds,
    resolve_device,
)
from tests.conftest import ROOT


def shipped_text() -> str:
    return resources.files("grader.core").joinpath(THRESHOLDS_FILE).read_text()


def test_shipped_file_is_valid_and_has_both_profiles() -> None:
    data = parse_thresholds(shipped_text())
    assert set(data) == {"cpu", "cuda", "leaderboard", "probes", "verdict"}
    assert load_thresholds("cpu") == data["cpu"]
    assert load_thresholds("cuda")["part2"]["min_speedup"] > 1


def test_benchmark_model_holds_the_workload_of_each_profile() -> None:
    from grader.parts.part2.cases import PUBLIC_MODEL, bench_model

    for device in ("cpu", "cuda"):
        bench = load_thresholds(device)["part2"]
        positions = bench["prompt_len"] + bench["new_tokens"]
        config = bench_model(PUBLIC_MODEL, positions, bench.get("model"))["config"]
        assert config["max_seq_len"] == positions
        assert config["vocab_size"] == PUBLIC_MODEL["config"]["vocab_size"]
        for size, value in bench.get("model", {}).items():
            assert config[size] == value
    # The cpu profile times the public sizes; the cuda profile a model sized for a GPU.
    assert "model" not in load_thresholds("cpu")["part2"]
    assert load_thresholds("cuda")["part2"]["model"]["d_model"] > PUBLIC_MODEL["config"]["d_model"]


@pytest.mark.parametrize(
    ("old", "new"),
    [  # regular expressions over the shipped text: no test quotes a threshold's value
        (r"min_speedup = [\d.]+", "min_speedup = 0.5"),  # a "speedup" below 1 passes anything
        (r"repeats = \d+", 'repeats = "five"'),
        (r"\[cuda\.part2\]", "[gpu.part2]"),
        (r"warmup = 1 ", "warmup = 1\nspeedup_min = 2 "),
        (r"enabled = false", 'enabled = "yes"'),
        (r'check = "3\.11"', 'check = "4.6"'),  # 4.6 measures no tokens/s
        (r'min_speedup = \{ "1" =', 'min_speedup = { "4" ='),  # batch 4 is not timed
        (r"min_speedup = \{[^}]*\}", "min_speedup = {}"),
        (r"min_work_ratio = [\d.]+", "min_work_ratio = 1.0"),  # no less work passes
        (r"\[probes\.part3\]", "[probes.part5]"),
        (r"max_cached_growth = [\d.]+", 'max_cached_growth = "flat"'),
    ],
)
def test_malformed_thresholds_are_rejected(old: str, new: str) -> None:
    text = shipped_text()
    assert re.search(old, text), old
    with pytest.raises(jsonschema.ValidationError):
        parse_thresholds(re.sub(old, lambda _: new, text, count=1))


def test_the_probes_limits_are_read_from_the_file() -> None:
    """Parts 2 and 3 judge their work and growth probes by ``[probes.<part>]``."""
    from grader.parts.part2 import cases as part2
    from grader.parts.part3 import cases as part3

    probes = parse_thresholds(shipped_text())["probes"]
    for cases, part in ((part2, "part2"), (part3, "part3")):
        assert probe_thresholds(part) == probes[part]
        assert probes[part]["min_work_ratio"] == cases.MIN_WORK_RATIO
        assert probes[part]["max_cached_growth"] == cases.MAX_CACHED_GROWTH


def test_each_reading_is_a_copy_of_its_own_and_a_bad_text_fails_every_time() -> None:
    """The validated file is kept between readings; a caller that edits its copy (a
    test's profile, a calibration) must not change what the next caller reads."""
    first = load_thresholds("cpu")
    first["part2"]["min_speedup"] = 0.0
    first["part3"]["batch_sizes"].append(99)
    again = load_thresholds("cpu")
    assert again["part2"]["min_speedup"] > 1 and 99 not in again["part3"]["batch_sizes"]
    bad = re.sub(r"min_speedup = [\d.]+", "min_speedup = 0.5", shipped_text(), count=1)
    for _ in range(2):
        with pytest.raises(jsonschema.ValidationError):
            parse_thresholds(bad)


def test_skeleton_harness_states_the_cpu_threshold() -> None:
    from tests.conftest import ASSIGNMENT, SOLUTION

    cpu = load_thresholds("cpu")["part2"]
    for folder in (SOLUTION, ASSIGNMENT):
        text = (folder / "transformer_skeleton.py").read_text()
        assert f"MIN_SPEEDUP = {cpu['min_speedup']!r}" in text
    assert cpu["prompt_len"] == 1000


def test_leaderboard_is_off_by_default_and_switched_on_in_the_file() -> None:
    benchmarks = {"3.11": {"leaderboard": {"tokens_per_s": 123.456, "speedup": 4.567}}}
    assert leaderboard_settings()["enabled"] is False
    assert leaderboard_entries(benchmarks, leaderboard_settings()) == []
    on = leaderboard_settings(shipped_text().replace("enabled = false", "enabled = true", 1))
    assert leaderboard_entries(benchmarks, on) == [
        {"name": "Cached decode (tokens/s)", "value": 123.5, "order": "desc"},
        {"name": "Speedup over cache-free", "value": 4.57, "order": "desc"},
    ]
    assert leaderboard_entries({}, on) == []  # the check measured nothing (it failed early)


def test_device_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda") == "cuda"
    monkeypatch.setattr("grader.core.thresholds.glob.glob", lambda pattern: [])
    assert resolve_device("auto") == "cpu"  # no NVIDIA device node: no probe at all


def test_leaderboard_reaches_results_json(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import SOLUTION, run_grade

    on = leaderboard_settings(shipped_text().replace("enabled = false", "enabled = true", 1))
    monkeypatch.setattr(
        "grader.grading.runner.leaderboard_settings", lambda: {**on, "check": "2.11"}
    )
    graded = run_grade(
        SOLUTION, tmp_path, parts=["part2"], tags=frozenset({"benchmark"}), device="auto"
    )
    assert [t["number"] for t in graded.data["tests"]] == ["2.11"]  # only the benchmark
    board = {e["name"]: e["value"] for e in graded.data["leaderboard"]}
    speedup = graded.data["extra_data"]["benchmarks"]["2.11"]["criteria"][0]["ratio"]["median"]
    assert board["Speedup over cache-free"] == round(speedup, 2)
    assert board["Cached decode (tokens/s)"] > 0
    assert "judged with the cpu threshold profile" in graded.data["output"]


def test_handout_states_the_cpu_thresholds() -> None:
    from tests.conftest import ASSIGNMENT

    cpu = load_thresholds("cpu")
    text = " ".join((ASSIGNMENT / "README.md").read_text().split())
    assert f"thresholds file ({cpu['part2']['min_speedup']:g}× on the CPU profile" in text
    assert f"at most {cpu['part4']['max_cached_growth']:g}× on the CPU profile" in text
    assert f"at least {cpu['part4']['min_no_cache_growth']:g}×" in text
    assert f"at least {cpu['part4']['min_speedup']:g}× the cached one" in text


def test_a_profile_is_provisional_only_where_its_table_says_so(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from grader.core.thresholds import THRESHOLDS_ENV, profile_provisional

    text = shipped_text()
    assert "provisional = true" in text  # the cuda profile, until calibrated on a GPU
    path = tmp_path / "thresholds.toml"
    path.write_text(text.replace("provisional = true", "provisional = false"))
    monkeypatch.setenv(THRESHOLDS_ENV, str(path))
    assert not profile_provisional("cuda")
    path.write_text(text.replace("[cpu.part2]", "[cpu]\nprovisional = true\n\n[cpu.part2]"))
    assert profile_provisional("cpu")


def test_every_profiles_benchmark_weights_fit_one_request_and_the_worker() -> None:
    """Parts 2 and 3 send their benchmark model's seeded weights in one request; the
    worker holds them and the model built from them at once."""
    import math

    from grader.parts.part2.cases import PUBLIC_MODEL, bench_model, state_dict_shapes
    from grader.parts.part3.cases import TOKENIZER_VOCAB, checkpoint_shapes
    from grader.sandbox.sandbox import Limits
    from grader.worker.protocol import MAX_REQUEST_BYTES

    tiny = json.loads((ROOT / "test_cases/public/part3/tiny_llama/params.json").read_text())
    for device in ("cpu", "cuda"):
        profile = load_thresholds(device)
        bench = profile["part2"]
        config = bench_model(PUBLIC_MODEL, bench["prompt_len"] + bench["new_tokens"],
                             bench.get("model"))["config"]  # fmt: skip
        sizes = [math.prod(s) * 4 for s in state_dict_shapes(config).values()]
        params = {**tiny, **profile["part3"].get("model", {})}
        sizes3 = [math.prod(s) * 4 for s in checkpoint_shapes(params, TOKENIZER_VOCAB).values()]
        for weights in (sum(sizes), sum(sizes3)):
            assert weights < MAX_REQUEST_BYTES
            assert 2 * weights < Limits().memory_bytes  # the arrays and the model built


def gpu_gradings_on_record() -> list[tuple[str, dict]]:
    """Every graded benchmark record of the cuda profile kept under docs/measurements/,
    with its file's name (which says whose submission it graded)."""
    found = []
    for path in sorted((ROOT / "docs" / "measurements").glob("*gpu*/*.json")):
        extra = json.loads(path.read_text()).get("extra_data") or {}
        if extra.get("benchmark_profile") == "cuda":
            found += [(path.name, r) for r in (extra.get("benchmarks") or {}).values()]
    return found


def test_the_cuda_profile_keeps_every_gpu_verdict_on_record() -> None:
    """Each reference grading on a GPU must pass under today's values, and each cache-free
    design's must fail: a new value that one of them contradicts needs new measurements."""
    from grader.ta.pooled import judged_again

    limits = load_thresholds("cuda")
    records = gpu_gradings_on_record()
    assert len(records) >= 20
    who = ("reference", "cache_free", "closer")
    assert all(any(w in name for name, _ in records) for w in who)
    for name, record in records:
        assert judged_again(record, limits) is ("reference" in name), (name, record["check"])
