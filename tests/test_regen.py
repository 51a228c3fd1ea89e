"""Test cases are generated, validated and checksummed; drift is reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from grader import regen
from grader.context import TEST_CASES, load_cases
from tests.conftest import SOLUTION, patched_solution


def test_committed_cases_match_the_solution() -> None:
    assert regen.check() == []


def test_generation_is_deterministic(tmp_path: Path) -> None:
    regen.write_cases(tmp_path / "a")
    regen.write_cases(tmp_path / "b")
    for path in (tmp_path / "a").rglob("*.json"):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()


def test_drift_from_the_solution_is_reported(tmp_path: Path) -> None:
    changed = patched_solution(
        tmp_path / "solution", "question1.py", [("final_norm = d", "final_norm = 2 * d")]
    )
    problems = regen.check(TEST_CASES, changed)
    assert any("differs from what solution/ generates" in p for p in problems)


def test_a_mutant_that_no_longer_applies_is_reported(tmp_path: Path) -> None:
    changed = patched_solution(
        tmp_path / "solution", "question1.py", [("norms = 2 * d  #", "norms = d + d  #")]
    )
    problems = regen.check(TEST_CASES, changed)
    assert any("no_norm_weights" in p and "cannot regenerate" in p for p in problems)


def test_tampering_with_a_case_file_is_reported(tmp_path: Path) -> None:
    cases = tmp_path / "cases"
    shutil.copytree(TEST_CASES, cases)
    path = cases / "public" / "part1.json"
    path.write_text(path.read_text().replace("8030261248", "8030261249"))
    problems = regen.check(cases, SOLUTION)
    assert any("changed since the manifest" in p for p in problems)


def test_schema_rejects_a_malformed_case_file() -> None:
    data = json.loads((TEST_CASES / "public" / "part1.json").read_text())
    data["cases"][0]["want"] = "complex"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, regen.case_schema("part1"))


def test_public_cases_hold_the_handout_figures() -> None:
    cases = load_cases("part1")["cases"]
    by_label = {(c["func"], c["label"]): c["expected"] for c in cases}
    assert by_label[("param_count", "LLaMA-3-8B")] == 8_030_261_248
    assert by_label[("param_count", "Llama-3.2-1B")] == 1_498_482_688
    assert by_label[("max_batch_size", "LLaMA-3-8B, 80 GiB, context 1024")] == 520
    assert by_label[("max_batch_size", "LLaMA-3-8B, TP = 2")] == 1160
    table = by_label[("answer_table", "defaults")]
    assert round(table["weight_gib"], 2) == 14.96
    assert table["kv_cache_per_request_gib"] == 0.125


def test_diagnosis_catalogue_records_mutant_values() -> None:
    cases = load_cases("part1")["cases"]
    kv = next(c for c in cases if c["label"] == "LLaMA-3-8B, context 1024, fp16")
    assert kv["mistakes"]["mha_kv_cache"] == 4 * kv["expected"]
    assert kv["mistakes"]["kv_missing_factor_2"] == kv["expected"] // 2


def test_hidden_cases_stay_out_of_the_public_file() -> None:
    public = json.loads((TEST_CASES / "public" / "part1.json").read_text())
    assert not any(c["label"].startswith("hidden") for c in public["cases"])
    assert load_cases("part1")["hidden_available"]
