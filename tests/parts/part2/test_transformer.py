"""Unit tests of the Part 2 reference model, its harness, and the student skeleton."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from grader.parts.part2.cases import PUBLIC_MODEL, chunk_plan, make_state_dict, state_dict_shapes
from grader.ta.regen import import_path, one_thread
from tests.conftest import ASSIGNMENT, ROOT, SOLUTION

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("transformer")

SOLUTION_FILE = SOLUTION / "transformer_skeleton.py"
SKELETON_FILE = ASSIGNMENT / "transformer_skeleton.py"
PUBLIC_DIR = ROOT / "test_cases" / "public" / "part2"
HARNESS_MARKER = "# ================= DO NOT MODIFY CODE BELOW THIS LINE"
VOCAB, D_MODEL, D_FF, LAYERS, MAX_LEN = 1000, 50, 100, 2, 128  # the course's model
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def sol() -> ModuleType:
    return import_path(SOLUTION_FILE, "part2_reference_transformer_under_test")


@pytest.fixture(scope="module")
def skel() -> ModuleType:
    return import_path(SKELETON_FILE, "part2_student_skeleton_under_test")


@pytest.fixture(scope="module", autouse=True)
def torch_on_one_thread() -> Iterator[None]:
    """One intra-op thread: tiny ops stay fast even when the machine's cores are busy."""
    with one_thread():
        yield


def random_model(sol: ModuleType, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return sol.DecoderOnlyTransformer(VOCAB, D_MODEL, D_FF, LAYERS, MAX_LEN).eval()


def run_harness(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def stepped_logits(model: torch.nn.Module, ids: torch.Tensor, steps: list[int]):
    """Feed ``ids`` in calls of ``steps`` tokens through the cache; logits and final cache."""
    assert sum(steps) == ids.shape[1]
    past, outs, start = None, [], 0
    for n in steps:
        logits, past = model(ids[:, start : start + n], past_kv=past, use_cache=True)
        assert logits.shape == (ids.shape[0], n, VOCAB)
        outs.append(logits)
        start += n
    return torch.cat(outs, dim=1), past


# ------------------------------------------------------------------------ causal mask


@pytest.mark.parametrize("t", [1, 2, 5, 9])
def test_causal_mask_without_cache_is_strict_upper_triangle(sol: ModuleType, t: int) -> None:
    mask = sol.causal_mask(t, t, CPU)
    assert mask.dtype == torch.bool
    assert mask.shape == (t, t)
    assert torch.equal(mask, torch.triu(torch.ones(t, t), diagonal=1).bool())


def test_causal_mask_single_cached_step_masks_nothing(sol: ModuleType) -> None:
    mask = sol.causal_mask(1, 5, CPU)
    assert mask.dtype == torch.bool
    assert mask.shape == (1, 5)
    assert not mask.any()


def test_causal_mask_chunk_is_shifted_by_the_past(sol: ModuleType) -> None:
    mask = sol.causal_mask(3, 7, CPU)
    assert mask.dtype == torch.bool
    assert mask.shape == (3, 7)
    t_past = 4
    for i in range(3):
        expected = [j > t_past + i for j in range(7)]
        assert mask[i].tolist() == expected, f"row {i}"


# ---------------------------------------------------------------- cached == uncached


@pytest.fixture(scope="module")
def model_and_ids(sol: ModuleType) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = random_model(sol, seed=1)
    torch.manual_seed(2)
    ids = torch.randint(0, VOCAB, (2, 13))
    with torch.no_grad():
        reference, none_cache = model(ids, use_cache=False)
    assert none_cache is None
    return model, ids, reference


@pytest.mark.parametrize("plan", ["full", "one_at_a_time", "chunks"])
@torch.no_grad()
def test_cached_logits_match_uncached(model_and_ids, plan: str) -> None:
    model, ids, reference = model_and_ids
    t = ids.shape[1]
    steps = {"full": [t], "one_at_a_time": [1] * t, "chunks": chunk_plan(t)}[plan]
    if plan == "chunks":
        assert len(steps) > 2 and max(steps[1:]) > 1  # a prefill and real multi-token chunks
    got, _ = stepped_logits(model, ids, steps)
    assert reference.shape == (2, t, VOCAB)
    torch.testing.assert_close(got, reference, atol=1e-5, rtol=0)


@torch.no_grad()
def test_batch_rows_are_independent(model_and_ids) -> None:
    model, ids, reference = model_and_ids
    for row in range(ids.shape[0]):
        alone, _ = model(ids[row : row + 1], use_cache=False)
        torch.testing.assert_close(alone, reference[row : row + 1], atol=1e-5, rtol=0)


@torch.no_grad()
def test_future_tokens_do_not_change_earlier_logits(model_and_ids) -> None:
    model, ids, reference = model_and_ids
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % VOCAB
    logits, _ = model(changed, use_cache=False)
    torch.testing.assert_close(logits[:, :-1], reference[:, :-1], atol=1e-5, rtol=0)
    assert not torch.allclose(logits[:, -1], reference[:, -1], atol=1e-3)


# --------------------------------------------------------------------------- the cache


@torch.no_grad()
def test_cache_structure_and_growth(model_and_ids) -> None:
    model, ids, _ = model_and_ids
    b = ids.shape[0]
    _, past = model(ids[:, :5], use_cache=True)
    assert isinstance(past, list) and len(past) == LAYERS
    for layer_kv in past:
        assert len(layer_kv) == 2
        k, v = layer_kv
        assert k.shape == (b, 5, D_MODEL) and v.shape == (b, 5, D_MODEL)
    _, past = model(ids[:, 5:8], past_kv=past, use_cache=True)
    assert len(past) == LAYERS
    for k, v in past:
        assert k.shape == (b, 8, D_MODEL) and v.shape == (b, 8, D_MODEL)


@torch.no_grad()
def test_incremental_cache_equals_full_pass_cache(model_and_ids) -> None:
    model, ids, _ = model_and_ids
    _, full = model(ids, use_cache=True)
    _, stepped = stepped_logits(model, ids, [1] * ids.shape[1])
    for (k_full, v_full), (k_step, v_step) in zip(full, stepped, strict=True):
        torch.testing.assert_close(k_step, k_full, atol=1e-5, rtol=0)
        torch.testing.assert_close(v_step, v_full, atol=1e-5, rtol=0)
    # Keys and values are different projections, and layers hold different caches.
    assert not torch.allclose(full[0][0], full[0][1])
    assert not torch.allclose(full[0][0], full[1][0])


@torch.no_grad()
def test_no_cache_returns_none_and_ignores_past(model_and_ids) -> None:
    model, ids, reference = model_and_ids
    _, past = model(ids[:, :4], use_cache=True)
    logits, new_past = model(ids, past_kv=None, use_cache=False)
    assert new_past is None
    torch.testing.assert_close(logits, reference, atol=0, rtol=0)
    logits, new_past = model(ids, past_kv=past, use_cache=False)
    assert new_past is None
    torch.testing.assert_close(logits, reference, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- dropout


def test_dropout_inactive_in_eval_and_active_in_train(sol: ModuleType) -> None:
    model = random_model(sol, seed=3)
    torch.manual_seed(4)
    ids = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        model.eval()
        a, _ = model(ids)
        b, _ = model(ids)
        assert torch.equal(a, b)
        model.train()
        c, _ = model(ids)
        d, _ = model(ids)
    assert not torch.allclose(c, d)
    assert not torch.allclose(c, a)
    assert any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


# ---------------------------------------------------------------------------- generate


@pytest.fixture(scope="module")
def gen_model(sol: ModuleType) -> torch.nn.Module:
    return random_model(sol, seed=5)


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    torch.manual_seed(6)
    return torch.randint(0, VOCAB, (2, 7))


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_shape_prefix_and_range(gen_model, prompt, use_cache: bool) -> None:
    before = prompt.clone()
    torch.manual_seed(7)
    out = gen_model.generate(prompt, 6, use_cache=use_cache)
    assert out.shape == (2, 13)
    assert out.dtype == prompt.dtype
    assert torch.equal(out[:, :7], prompt)
    assert torch.equal(prompt, before)  # the prompt is not modified in place
    assert int(out.min()) >= 0 and int(out.max()) < VOCAB


def test_generate_same_seed_same_tokens_with_and_without_cache(gen_model, prompt) -> None:
    torch.manual_seed(8)
    cached = gen_model.generate(prompt, 10, temperature=1.0, use_cache=True)
    torch.manual_seed(8)
    uncached = gen_model.generate(prompt, 10, temperature=1.0, use_cache=False)
    assert torch.equal(cached, uncached)
    torch.manual_seed(9)
    other = gen_model.generate(prompt, 10, temperature=1.0, use_cache=True)
    assert not torch.equal(other, cached)  # sampling really draws from the seed


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_low_temperature_is_greedy(gen_model, prompt, use_cache: bool) -> None:
    n = 8
    tokens = prompt
    with torch.no_grad():
        for _ in range(n):
            last = gen_model(tokens)[0][:, -1, :]
            top2 = last.topk(2, dim=-1).values
            assert float((top2[:, 0] - top2[:, 1]).min()) > 2e-3  # argmax is well defined
            tokens = torch.cat([tokens, last.argmax(dim=-1, keepdim=True)], dim=1)
    torch.manual_seed(10)
    out = gen_model.generate(prompt, n, temperature=1e-4, use_cache=use_cache)
    assert torch.equal(out, tokens)


def _count_forward_lengths(model: torch.nn.Module) -> list[int]:
    lengths: list[int] = []
    original = model.forward

    def counting(input_ids, *args, **kwargs):
        lengths.append(int(input_ids.shape[1]))
        return original(input_ids, *args, **kwargs)

    model.forward = counting
    return lengths


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_forward_call_lengths(sol: ModuleType, use_cache: bool) -> None:
    model = random_model(sol, seed=11)
    torch.manual_seed(12)
    ids = torch.randint(0, VOCAB, (2, 5))
    lengths = _count_forward_lengths(model)
    out = model.generate(ids, 4, use_cache=use_cache)
    assert out.shape == (2, 9)
    if use_cache:
        assert lengths == [5, 1, 1, 1]
    else:
        assert lengths == [5, 6, 7, 8]


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_up_to_max_seq_len(gen_model, use_cache: bool) -> None:
    torch.manual_seed(13)
    ids = torch.randint(0, VOCAB, (1, MAX_LEN - 20))
    out = gen_model.generate(ids, 20, use_cache=use_cache)
    assert out.shape == (1, MAX_LEN)
    assert torch.equal(out[:, : MAX_LEN - 20], ids)


# --------------------------------------------------------------------------- weights


def test_state_dict_keys_and_shapes_match_the_grader(sol: ModuleType) -> None:
    cfg = PUBLIC_MODEL["config"]
    model = sol.DecoderOnlyTransformer(
        cfg["vocab_size"], cfg["d_model"], cfg["d_ff"], cfg["num_layers"], cfg["max_seq_len"]
    )
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == state_dict_shapes(cfg)


def test_public_weights_load_strictly_and_match_the_seeded_draw(sol: ModuleType) -> None:
    cfg = PUBLIC_MODEL["config"]
    model = sol.DecoderOnlyTransformer(
        cfg["vocab_size"], cfg["d_model"], cfg["d_ff"], cfg["num_layers"], cfg["max_seq_len"]
    )
    stored = torch.load(PUBLIC_DIR / "model_state_dict.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(stored, strict=True)
    expected = make_state_dict(PUBLIC_MODEL)
    assert set(stored) == set(expected)
    for name, array in expected.items():
        assert stored[name].dtype == torch.float32, name
        assert torch.equal(stored[name], torch.from_numpy(np.asarray(array))), name
        assert torch.equal(model.state_dict()[name], stored[name]), name


@torch.no_grad()
def test_public_cases_pass_in_process(sol: ModuleType) -> None:
    cfg = PUBLIC_MODEL["config"]
    model = sol.DecoderOnlyTransformer(
        cfg["vocab_size"], cfg["d_model"], cfg["d_ff"], cfg["num_layers"], cfg["max_seq_len"]
    )
    weights = make_state_dict(PUBLIC_MODEL)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    model.eval()
    cases = json.loads((PUBLIC_DIR / "test_cases.json").read_text())
    assert len(cases) == 10
    for case in cases:
        ids = torch.tensor(case["input_ids"])
        assert ids.shape[0] == 1
        logits, _ = model(ids)
        expected = torch.tensor(case["expected_logits_no_cache"])
        assert expected.shape == (1, ids.shape[1], VOCAB)
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
        seq, _ = stepped_logits(model, ids, [1] * ids.shape[1])
        seq_expected = torch.tensor(case["expected_logits_sequential"])
        torch.testing.assert_close(seq, seq_expected, atol=1e-4, rtol=0)


# --------------------------------------------------------------------------- harness


@pytest.mark.parametrize("mode", ["evaluate", "kv_evaluate"])
def test_harness_evaluate_modes_pass(tmp_path: Path, mode: str) -> None:
    proc = run_harness(SOLUTION_FILE, tmp_path, "--mode", mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Pass rate: 100.00% (10/10)" in proc.stdout
    assert "All tests passed: True" in proc.stdout


def test_harness_evaluate_fails_on_wrong_expectations(tmp_path: Path) -> None:
    cases = json.loads((PUBLIC_DIR / "test_cases.json").read_text())[:2]
    cases[0]["expected_logits_no_cache"][0][0][0] += 1.0
    bad = tmp_path / "bad_cases.json"
    bad.write_text(json.dumps(cases))
    proc = run_harness(SOLUTION_FILE, tmp_path, "--mode", "evaluate", "--test_cases", str(bad))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Pass rate: 50.00% (1/2)" in proc.stdout
    assert "Test case 1: no cache: failed" in proc.stdout


def test_harness_benchmark_writes_json_and_png(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = run_harness(
        SOLUTION_FILE,
        tmp_path,
        *("--mode", "benchmark", "--lengths", "10,30", "--new_tokens", "3"),
        *("--repeats", "1", "--out_dir", str(out)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((out / "benchmark_results.json").read_text())
    assert [r["seq_len"] for r in rows] == [10, 30]
    for row in rows:
        assert set(row) == {"seq_len", "no_cache_s", "cache_s", "speedup"}
        assert row["no_cache_s"] > 0 and row["cache_s"] > 0
        assert row["speedup"] == pytest.approx(row["no_cache_s"] / row["cache_s"])
    assert (out / "benchmark.png").read_bytes()[:4] == b"\x89PNG"


def test_harness_benchmark_times_prompts_past_the_course_max_seq_len(tmp_path: Path) -> None:
    # The course's weights embed 128 positions; the benchmark builds its own seeded model.
    out = tmp_path / "bench"
    proc = run_harness(
        SOLUTION_FILE,
        tmp_path,
        *("--mode", "benchmark", "--lengths", "4,300", "--new_tokens", "5"),
        *("--repeats", "1", "--out_dir", str(out)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((out / "benchmark_results.json").read_text())
    assert [r["seq_len"] for r in rows] == [4, 300]


def test_benchmark_model_is_seeded_and_fits_the_longest_run(sol: ModuleType) -> None:
    config = sol.ModelConfig()
    first = sol.benchmark_model(config, 1020)
    second = sol.benchmark_model(config, 1020)
    assert first.pos_embedding.weight.shape == (1020, config.d_model)
    for name, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[name]), name


def test_harness_reports_a_missing_state_dict(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    proc = run_harness(SOLUTION_FILE, tmp_path, "--model_state_dict", str(missing))
    assert proc.returncode == 1
    assert "Error loading model state dictionary" in proc.stdout


# -------------------------------------------------------------------------- skeleton


def test_skeleton_harness_is_identical_to_the_solution() -> None:
    sol_text = SOLUTION_FILE.read_text()
    skel_text = SKELETON_FILE.read_text()
    assert sol_text.count(HARNESS_MARKER) == 1
    assert skel_text.count(HARNESS_MARKER) == 1
    sol_tail = sol_text[sol_text.index(HARNESS_MARKER) :]
    skel_tail = skel_text[skel_text.index(HARNESS_MARKER) :]
    assert sol_tail.startswith(HARNESS_MARKER) and len(sol_tail) > 1000
    assert skel_tail == sol_tail


def test_skeleton_constructs_and_forward_is_not_implemented(skel: ModuleType) -> None:
    model = skel.DecoderOnlyTransformer(VOCAB, D_MODEL, D_FF, LAYERS, MAX_LEN)
    assert model.max_seq_len == MAX_LEN
    with pytest.raises(NotImplementedError):
        model(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(NotImplementedError):
        skel.causal_mask(2, 2, CPU)


def _public_api(module: ModuleType) -> dict[str, object]:
    """Classes and functions defined in ``module``, and the methods defined in each class."""
    api: dict[str, object] = {}
    for name, obj in vars(module).items():
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            api[name] = obj
            for attr, member in vars(obj).items():
                func = (
                    member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                )
                if inspect.isfunction(func):
                    api[f"{name}.{attr}"] = func
        elif inspect.isfunction(obj):
            api[name] = obj
    return api


def test_skeleton_keeps_every_name_and_signature(sol: ModuleType, skel: ModuleType) -> None:
    sol_api, skel_api = _public_api(sol), _public_api(skel)
    assert "DecoderOnlyTransformer.generate" in sol_api
    assert "causal_mask" in sol_api
    missing = sorted(set(sol_api) - set(skel_api))
    assert not missing, f"missing from the skeleton: {missing}"
    for name, obj in sol_api.items():
        assert inspect.signature(skel_api[name]) == inspect.signature(obj), name
    sample = inspect.getattr_static(skel.DecoderOnlyTransformer, "sample")
    assert isinstance(sample, staticmethod)


def test_skeleton_harness_fails_with_a_message(tmp_path: Path) -> None:
    proc = run_harness(SKELETON_FILE, tmp_path, "--mode", "evaluate")
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "Error loading model state dictionary" in output
    assert "Pass rate: 100.00%" not in output


def test_blank_skeleton_harness_says_the_submodules_are_missing(tmp_path: Path) -> None:
    """Not torch's list of every unexpected key: a count, a few names and what to do."""
    proc = run_harness(SKELETON_FILE, tmp_path)
    assert proc.returncode == 1
    assert "Unexpected key(s)" not in proc.stdout
    assert "In the file but not in your model (30)" in proc.stdout
    assert "Create every submodule in the __init__ methods" in proc.stdout
    assert len(proc.stdout.splitlines()) <= 5


def test_weights_reach_the_model_without_another_copy() -> None:
    """A GPU workload's 1.6 GB of weights arrive as read-only views of the request; the
    adapter wraps them as they are (load_state_dict copies them into the model)."""
    from grader.parts.part2.adapter import _tensor

    blob = np.arange(12, dtype=np.float32).tobytes()
    array = np.frombuffer(blob, dtype=np.float32).reshape(3, 4)  # read-only, as received
    tensor = _tensor(array)
    assert tensor.data_ptr() == array.ctypes.data and tuple(tensor.shape) == (3, 4)
