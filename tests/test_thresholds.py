"""The benchmark thresholds file: validated, one profile per device."""

from __future__ import annotations

from importlib import resources

import jsonschema
import pytest

from grader.thresholds import THRESHOLDS_FILE, load_thresholds, parse_thresholds


def shipped_text() -> str:
    return resources.files("grader").joinpath(THRESHOLDS_FILE).read_text()


def test_shipped_file_is_valid_and_has_both_profiles() -> None:
    data = parse_thresholds(shipped_text())
    assert set(data) == {"cpu", "cuda"}
    assert load_thresholds("cpu") == data["cpu"]
    assert load_thresholds("cuda")["part2"]["min_speedup"] > 1


def test_benchmark_prompt_fits_the_model() -> None:
    for device in ("cpu", "cuda"):
        bench = load_thresholds(device)["part2"]
        assert bench["prompt_len"] + bench["new_tokens"] <= 1024  # the public model's positions


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("min_speedup = 3.0", "min_speedup = 0.5"),  # a "speedup" below 1 passes anything
        ("repeats = 5", 'repeats = "five"'),
        ("[cuda.part2]", "[gpu.part2]"),
        ("warmup = 1 ", "warmup = 1\nspeedup_min = 2 "),
    ],
)
def test_malformed_thresholds_are_rejected(old: str, new: str) -> None:
    text = shipped_text()
    assert old in text
    with pytest.raises(jsonschema.ValidationError):
        parse_thresholds(text.replace(old, new, 1))


def test_skeleton_harness_states_the_cpu_threshold() -> None:
    from tests.conftest import ASSIGNMENT, SOLUTION

    cpu = load_thresholds("cpu")["part2"]
    for folder in (SOLUTION, ASSIGNMENT):
        text = (folder / "transformer_skeleton.py").read_text()
        assert f"MIN_SPEEDUP = {cpu['min_speedup']!r}" in text
    assert cpu["prompt_len"] == 1000
