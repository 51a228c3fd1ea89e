"""Test cases are generated, validated and checksummed; drift is reported."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from grader.core.paths import TEST_CASES
from grader.runtime.context import load_cases
from grader.ta import freshness, regen
from tests.conftest import SOLUTION, patched_solution

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("regen")


def regen_inputs_key() -> str:
    """What a regeneration's output depends on: every file it reads (the digest ``make
    dist`` records, :func:`freshness.content_digest`), the interpreter, the machine and
    every installed package's version (torch's and transformers' weights, numpy's RNG)."""
    # A set: a package seen twice on sys.path (the project's egg-info beside its editable
    # install, as plain python and pytest-xdist's workers see it) is one package.
    packages = sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()})
    env = [sys.version, platform.platform(), platform.machine(), *packages]
    return hashlib.sha256("\n".join([freshness.content_digest(), *env]).encode()).hexdigest()


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def fresh_cases(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cases as solution/ generates them now, written once for every test here.

    Kept in pytest's cache under the key of everything they depend on, so a warm run of the
    suite on unchanged inputs reuses them; any change to solution/, assignment/, the cases,
    the grader code that builds them or a package regenerates (``KVGRADER_REGEN_AGAIN=1``
    or ``pytest --cache-clear`` always does)."""
    kept = request.config.cache.mkdir("regen-fresh-cases")
    key = regen_inputs_key()
    cached, complete = kept / key[:32], kept / f"{key[:32]}.complete"
    if complete.is_file() and os.environ.get("KVGRADER_REGEN_AGAIN") != "1":
        return cached
    out = tmp_path_factory.mktemp("fresh")
    regen.write_cases(out)
    shutil.rmtree(kept, ignore_errors=True)  # one content kept: the last one generated
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copytree(out, cached)
    complete.write_text(key + "\n")  # written last: a copy cut short is never reused
    return out


def test_the_kept_cases_follow_every_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to a file the regeneration reads, or to a package's version, is another key."""
    key = regen_inputs_key()
    assert regen_inputs_key() == key
    monkeypatch.setattr(freshness, "content_digest", lambda: "another content")
    assert regen_inputs_key() != key
    monkeypatch.undo()
    real = metadata.distributions
    torch_dist = metadata.distribution("torch")

    other = SimpleNamespace(metadata={"Name": "torch"}, version=torch_dist.version + ".post1")
    others = [d for d in real() if d.metadata["Name"] != "torch"]
    monkeypatch.setattr(metadata, "distributions", lambda: [*others, other])
    assert regen_inputs_key() != key
    # ... but the same package found twice on sys.path is the same environment
    monkeypatch.setattr(metadata, "distributions", lambda: [*real(), *real()])
    assert regen_inputs_key() == key


def test_committed_cases_match_the_solution(fresh_cases: Path) -> None:
    assert regen.check(fresh=fresh_cases) == []


def _nudge(value: object, factor: float) -> object:
    """Every float in a JSON document scaled by ``factor`` (float32 arrays too)."""
    from grader.core.arrays import decode_array, encode_array

    if isinstance(value, dict) and {"dtype", "shape", "data"} <= set(value):
        return encode_array(decode_array(value) * (1 + (factor - 1) / 100))  # float32 noise
    if isinstance(value, dict):
        return {k: _nudge(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_nudge(v, factor) for v in value]
    return value * factor if isinstance(value, float) else value


def test_cases_from_another_cpu_are_not_stale(tmp_path: Path, fresh_cases: Path) -> None:
    """Committed floats off by 1e-4 relative (float32 arrays by 1e-6), as another CPU
    leaves them, are still up to date; the manifest follows the nudged bytes."""
    cases = tmp_path / "cases"
    shutil.copytree(TEST_CASES, cases)
    manifest = json.loads((cases / regen.MANIFEST).read_text())
    nudged = 0
    for rel in manifest["files"]:
        path = cases / rel
        if path.suffix == ".json" and not rel.startswith(("public/part1", "hidden/part1")):
            before = path.read_text()
            path.write_text(json.dumps(_nudge(json.loads(before), 1 + 1e-4)))
            nudged += path.read_text() != before
            manifest["files"][rel] = regen.sha256(path)
    (cases / regen.MANIFEST).write_text(json.dumps(manifest))
    assert nudged >= 5
    assert regen.check(cases, SOLUTION, fresh=fresh_cases) == []


@pytest.mark.slow  # a second regeneration of every part (about 2 CPU-minutes): make slow-tests
def test_generation_is_deterministic(tmp_path: Path, fresh_cases: Path) -> None:
    """Byte for byte, so a regeneration leaves git clean (the drift test compares meaning)."""
    regen.write_cases(tmp_path / "b")
    files = [p for p in fresh_cases.rglob("*") if p.is_file()]
    assert any(p.suffix == ".pt" for p in files)
    for path in files:
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(fresh_cases)).read_bytes()


def test_drift_from_the_solution_is_reported(tmp_path: Path) -> None:
    changed = patched_solution(
        tmp_path / "solution", "question1.py", [("final_norm = d", "final_norm = 2 * d")]
    )
    problems = regen.check(TEST_CASES, changed, parts=["part1"])
    assert any("differs from what solution/ generates" in p for p in problems)


def test_a_mutant_that_no_longer_applies_is_reported(tmp_path: Path) -> None:
    changed = patched_solution(
        tmp_path / "solution", "question1.py", [("norms = 2 * d  #", "norms = d + d  #")]
    )
    problems = regen.check(TEST_CASES, changed, parts=["part1"])  # the mutant's part
    assert any("no_norm_weights" in p and "cannot regenerate" in p for p in problems)


def test_tampering_with_a_case_file_is_reported(tmp_path: Path, fresh_cases: Path) -> None:
    cases = tmp_path / "cases"
    shutil.copytree(TEST_CASES, cases)
    path = cases / "hidden" / "part1.json"
    path.write_text(path.read_text().replace("8030261248", "8030261249"))
    public = cases / "public" / "part1.json"
    seal = json.loads(public.read_text())["cases"][0]["sealed"]["expected"]["int"]
    public.write_text(public.read_text().replace(seal, seal[::-1]))
    problems = regen.check(cases, SOLUTION, fresh=fresh_cases)
    assert any("changed since the manifest" in p for p in problems)
    assert any("hidden/part1.json: differs" in p for p in problems)  # and by meaning
    assert any("public/part1.json: differs" in p for p in problems)  # a seal, exactly


def test_schema_rejects_a_malformed_case_file() -> None:
    data = json.loads((TEST_CASES / "public" / "part1.json").read_text())
    data["cases"][0]["want"] = "complex"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, regen.case_schema("part1"))


def test_public_cases_hold_the_handout_figures() -> None:
    """Sealed in the public file; in plain form in the hidden file's answers."""
    merged = load_cases("part1")
    by_label = {
        (c["func"], c["label"]): merged["answers"][c["id"]]["expected"]
        for c in merged["cases"]
        if c["visibility"] == "public" and not c.get("own_input")
    }
    assert by_label[("param_count", "LLaMA-3-8B")] == 8_030_261_248
    assert by_label[("param_count", "Llama-3.2-1B")] == 1_498_482_688
    assert by_label[("max_batch_size", "LLaMA-3-8B, 80 GiB, context 1024")] == 520
    assert by_label[("max_batch_size", "LLaMA-3-8B, TP = 2")] == 1160
    table = by_label[("answer_table", "defaults")]
    assert round(table["weight_gib"], 2) == 14.96
    assert table["kv_cache_per_request_gib"] == 0.125


def test_diagnosis_catalogue_records_mutant_values() -> None:
    kv = load_cases("part1")["answers"]["1.3 LLaMA-3-8B, context 1024, fp16"]
    assert kv["mistakes"]["mha_kv_cache"] == 4 * kv["expected"]
    assert kv["mistakes"]["kv_missing_factor_2"] == kv["expected"] // 2


def test_hidden_cases_stay_out_of_the_public_file() -> None:
    public = json.loads((TEST_CASES / "public" / "part1.json").read_text())
    assert not any(c["label"].startswith("hidden") for c in public["cases"])
    assert load_cases("part1")["hidden_available"]


# ---------------------------------------------------------------------- Part 2


def test_part2_files_are_in_the_manifest() -> None:
    manifest = json.loads((TEST_CASES / "manifest.json").read_text())["files"]
    for rel in (
        "public/part2.json",
        "public/part2/test_cases.json",
        "public/part2/model_state_dict.pt",
        "hidden/part2.json",
    ):
        assert rel in manifest


def test_course_format_public_cases() -> None:
    cases = json.loads((TEST_CASES / "public" / "part2" / "test_cases.json").read_text())
    jsonschema.validate(cases, regen.case_schema("part2_course_cases"))
    assert len(cases) == 10
    for case in cases:
        length = len(case["input_ids"][0])
        for key in ("no_cache", "with_cache", "sequential"):
            logits = case[f"expected_logits_{key}"]
            assert (len(logits), len(logits[0]), len(logits[0][0])) == (1, length, 1000)


def test_weights_are_reproducible_from_their_seed() -> None:
    from grader.core.arrays import weights_digest
    from grader.parts.part2.cases import make_state_dict

    meta = load_cases("part2")
    for name, spec in meta["models"].items():
        assert weights_digest(make_state_dict(spec)) == spec["weights_sha256"], name
    assert set(meta["models"]) == {"public", "hidden", "one_layer"}  # one_layer: check 2.7


def test_part2_schema_rejects_malformed_cases() -> None:
    data = json.loads((TEST_CASES / "hidden" / "part2.json").read_text())
    data["cases"][0]["steps"] = [0]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, regen.case_schema("part2"))
    course = json.loads((TEST_CASES / "public" / "part2" / "test_cases.json").read_text())
    del course[0]["expected_logits_sequential"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(course, regen.case_schema("part2_course_cases"))


def test_part2_hidden_cases_cover_the_promised_ground() -> None:
    meta = load_cases("part2")
    hidden = [c for c in meta["cases"] if c["visibility"] == "hidden"]
    public_cases = json.loads((TEST_CASES / "public" / "part2.json").read_text())["cases"]
    assert public_cases == []  # hidden cases stay out of the public file
    models = meta["models"]
    assert any(c["model"] == "hidden" for c in hidden)  # other weights and sizes
    assert any(len(c["input_ids"]) > 1 for c in hidden)  # batch > 1
    assert any(  # lengths up to max_seq_len
        len(c["input_ids"][0]) == models[c["model"]]["config"]["max_seq_len"] for c in hidden
    )
    assert any(c["steps"] and len(set(c["steps"][1:])) >= 1 and c["steps"][1] > 1 for c in hidden)


def test_part2_catalogue_names_every_mutant_somewhere() -> None:
    from grader.ta.mutants import load_mutants

    signatures = load_cases("part2")["signatures"]
    seen = {name for probe in signatures.values() for name in probe}
    assert {m.name for m in load_mutants("part2", combined=False)} <= seen


def test_changing_the_solution_model_is_drift(tmp_path: Path) -> None:
    changed = patched_solution(
        tmp_path / "solution",
        "transformer_skeleton.py",
        [("return self.fc2(F.relu(self.fc1(x)))", "return self.fc2(F.relu(self.fc1(x))) * 1.01")],
    )
    problems = regen.check(TEST_CASES, changed, parts=["part2"])
    assert any("public/part2/test_cases.json" in p for p in problems)
    assert any("hidden/part2.json" in p for p in problems)


# ---------------------------------------------------------------------- Part 3


def test_part3_checkpoint_is_in_metas_layout_and_manifest() -> None:
    manifest = json.loads((TEST_CASES / "manifest.json").read_text())["files"]
    ckpt = TEST_CASES / "public" / "part3" / "tiny_llama"
    for name in ("params.json", "consolidated.00.pth", "tokenizer.model"):
        assert (ckpt / name).is_file()
        assert f"public/part3/tiny_llama/{name}" in manifest
    params = json.loads((ckpt / "params.json").read_text())
    assert params["n_kv_heads"] < params["n_heads"]  # GQA
    assert params["use_scaled_rope"] is True
    # The tokenizer is the head of the real cl100k_base file: rank 0 is byte "!".
    first = (ckpt / "tokenizer.model").read_text().splitlines()[0]
    assert first == "IQ== 0"


def test_part3_weights_are_reproducible_and_hidden_model_differs() -> None:
    from grader.parts.part3.cases import make_weights

    meta = load_cases("part3")
    for name, spec in meta["models"].items():
        weights = make_weights(spec["params"], spec["vocab_size"], spec["seed"])
        from grader.core.arrays import weights_digest

        assert weights_digest(weights) == spec["weights_sha256"], name
    hidden = meta["models"]["hidden"]["params"]
    assert hidden["n_heads"] // hidden["n_kv_heads"] != 2  # another GQA ratio than public


def test_part3_schema_rejects_malformed_cases() -> None:
    data = json.loads((TEST_CASES / "hidden" / "part3.json").read_text())
    data["cases"][0]["check"] = "2.1"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, regen.case_schema("part3"))


def test_a_part_scoped_check_regenerates_only_that_part(tmp_path: Path) -> None:
    """``parts`` limits the regeneration: a change to Part 2's model is no drift for a
    check of Part 1 alone, and Part 1's files are still compared."""
    changed = patched_solution(
        tmp_path / "solution",
        "transformer_skeleton.py",
        [("return self.fc2(F.relu(self.fc1(x)))", "return self.fc2(F.relu(self.fc1(x))) * 1.01")],
    )
    assert regen.check(TEST_CASES, changed, parts=["part1"]) == []
    written = regen.write_cases(tmp_path / "part1", changed, parts=["part1"])
    assert written and all("part1" in str(p.relative_to(tmp_path / "part1")) for p in written)


def test_one_part_regenerated_in_place_keeps_the_others_in_the_manifest(tmp_path: Path) -> None:
    """``regen --parts part1`` rewrites Part 1's files and their manifest entries only."""
    cases = tmp_path / "cases"
    shutil.copytree(TEST_CASES, cases)
    before = json.loads((cases / regen.MANIFEST).read_text())["files"]
    (cases / "public" / "part1.json").write_text("{}")  # stale: regeneration must fix it
    written = regen.write_cases(cases, parts=["part1"])
    after = json.loads((cases / regen.MANIFEST).read_text())["files"]
    assert {p.relative_to(cases).as_posix() for p in written} <= {
        rel for rel in after if "part1" in rel
    }
    assert set(after) == set(before)
    assert {k: v for k, v in after.items() if "part1" not in k} == {
        k: v for k, v in before.items() if "part1" not in k
    }
    assert regen.check(cases, parts=["part1"]) == []


def test_no_public_case_is_called_hidden() -> None:
    """The self-check runs only public cases: none of their labels may say "hidden"."""
    labels = {
        path.name: [c.get("label", "") for c in json.loads(path.read_text()).get("cases", [])]
        for path in sorted((TEST_CASES / "public").glob("*.json"))
    }
    assert len([name for name, found in labels.items() if found]) >= 3
    for name, found in labels.items():
        assert not [x for x in found if "hidden" in x], name
