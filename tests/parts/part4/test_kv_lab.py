"""Part 4: the reference kv_lab.py on a randomly initialised distilgpt2-shaped model, and
the student skeleton's names, signatures and TODOs."""

from __future__ import annotations

import ast
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

from grader.ta.regen import import_path, one_thread

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("kv_lab")

ROOT = Path(__file__).resolve().parents[3]
SOLUTION_FILE = ROOT / "solution" / "kv_lab.py"
SKELETON_FILE = ROOT / "assignment" / "kv_lab.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BYTES_PER_TOKEN_FP32 = 36_864  # 2 (K, V) x 768 x 6 layers x 4 bytes
TODOS = {
    "model_config_summary",
    "generate_no_cache",
    "generate_with_cache",
    "generate_with_cache_from",
    "measure_latency",
    "theoretical_kv_bytes",
    "measured_kv_bytes",
    "quantize_kv_int8",
    "dequantize_kv_int8",
    "quantized_kv_bytes",
}


kv = import_path(SOLUTION_FILE, "reference_kv_lab")


@pytest.fixture(scope="module", autouse=True)
def torch_on_one_thread() -> Iterator[None]:
    """One thread: the timings and the run time do not depend on the machine's cores."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**kv.DISTILGPT2)).eval()


def prompt(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, kv.DISTILGPT2["vocab_size"], (batch, length), generator=gen)


@torch.no_grad()
def prefill(model: GPT2LMHeadModel, ids: torch.Tensor) -> DynamicCache:
    return model(ids, use_cache=True).past_key_values


# ------------------------------------------------------------------------ Tasks 1-3


def test_config_summary(model: GPT2LMHeadModel) -> None:
    summary = kv.model_config_summary(model)
    assert summary == {
        "n_layers": 6,
        "hidden_size": 768,
        "n_heads": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    assert all(type(v) is int for v in summary.values())


def test_cached_and_cache_free_greedy_tokens_agree(model: GPT2LMHeadModel) -> None:
    ids = prompt(2, 6)
    before = ids.clone()
    plain = kv.generate_no_cache(model, ids, 10)
    cached = kv.generate_with_cache(model, ids, 10)
    assert plain.shape == cached.shape == (2, 16)
    assert torch.equal(plain, cached)
    assert torch.equal(cached[:, :6], before) and torch.equal(ids, before)


def test_call_pattern_prompt_once_then_one_token(model: GPT2LMHeadModel) -> None:
    """The cached path feeds the prompt once then one token a call; the other, everything."""
    seen: list[int] = []
    forward = model.forward

    def recording(input_ids: torch.Tensor, *args, **kwargs):
        seen.append(input_ids.shape[-1])
        return forward(input_ids, *args, **kwargs)

    model.forward = recording
    try:
        kv.generate_with_cache(model, prompt(1, 5), 4)
        cached, seen[:] = list(seen), []
        kv.generate_no_cache(model, prompt(1, 5), 4)
    finally:
        del model.forward
    assert cached == [5, 1, 1, 1]
    assert seen == [5, 6, 7, 8]


def test_generation_continues_from_a_cache(model: GPT2LMHeadModel) -> None:
    ids = prompt(1, 7, seed=3)
    from_cache = kv.generate_with_cache_from(model, ids, prefill(model, ids[:, :-1]), 6)
    assert torch.equal(from_cache, kv.generate_with_cache(model, ids, 6))
    with pytest.raises(ValueError, match="fewer tokens"):
        kv.generate_with_cache_from(model, ids, prefill(model, ids), 1)


def test_measure_latency_returns_one_figure_per_length(model: GPT2LMHeadModel) -> None:
    out = kv.measure_latency(model, (2, 3), prompt_len=4, warmup=0, repeats=1)
    assert out["L"] == [2, 3]
    for key in ("no_cache_ms_per_token", "cache_ms_per_token"):
        assert len(out[key]) == 2 and all(x > 0 for x in out[key])


# --------------------------------------------------------------------------- Task 4


def test_theoretical_bytes_formula() -> None:
    assert kv.theoretical_kv_bytes(1, 768, 6, 4) == BYTES_PER_TOKEN_FP32
    assert kv.theoretical_kv_bytes(256, 768, 6) == 2 * 256 * 768 * 6 * 2
    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        L, D, n, b = (int(x) for x in torch.randint(1, 4096, (4,), generator=gen))
        got = kv.theoretical_kv_bytes(L, D, n, b)
        assert type(got) is int and got == 2 * L * D * n * b


def test_measured_bytes_of_a_fp32_cache(model: GPT2LMHeadModel) -> None:
    for tokens in (1, 9):
        cache = prefill(model, prompt(1, tokens))
        assert isinstance(cache, DynamicCache)  # transformers 5.23's cache object
        assert kv.measured_kv_bytes(cache) == BYTES_PER_TOKEN_FP32 * tokens
    batch = prefill(model, prompt(3, 4))
    assert kv.measured_kv_bytes(batch) == BYTES_PER_TOKEN_FP32 * 3 * 4


def test_measured_bytes_grow_with_generation(model: GPT2LMHeadModel) -> None:
    ids = prompt(1, 4)
    cache = prefill(model, ids[:, :-1])
    kv.generate_with_cache_from(model, ids, cache, 5)  # extends the cache in place
    assert kv.measured_kv_bytes(cache) == BYTES_PER_TOKEN_FP32 * (4 + 5 - 1)


def test_measured_bytes_of_legacy_tuples_and_other_dtypes() -> None:
    k = torch.zeros(2, 12, 5, 64, dtype=torch.float16)  # (B, H, T, head_dim)
    legacy = tuple((k, k.clone()) for _ in range(6))
    assert kv.measured_kv_bytes(legacy) == 6 * 2 * k.numel() * 2
    assert kv.measured_kv_bytes([[k.float(), k.float()]]) == 2 * k.numel() * 4
    assert kv.measured_kv_bytes(DynamicCache()) == 0


# --------------------------------------------------------------------- Task 5 (bonus)


def test_int8_round_trip(model: GPT2LMHeadModel) -> None:
    cache = prefill(model, prompt(2, 12))
    pairs = [(k.clone(), v.clone()) for k, v in kv.kv_pairs(cache)]
    q = kv.quantize_kv_int8(cache)
    dtypes = {t.dtype for layer in q["layers"] for t in layer.values()}
    assert dtypes == {torch.int8, torch.float16}
    fp16_bytes = kv.measured_kv_bytes(cache) // 2
    assert kv.quantized_kv_bytes(q) <= 0.55 * fp16_bytes
    restored = kv.dequantize_kv_int8(q)
    assert isinstance(restored, DynamicCache)
    for (k0, v0), (k1, v1) in zip(pairs, kv.kv_pairs(restored), strict=True):
        assert k1.shape == k0.shape and k1.dtype == k0.dtype and v1.shape == v0.shape
        assert torch.equal(torch.sign(k1[k0.abs() > 0.05]), torch.sign(k0[k0.abs() > 0.05]))
    assert kv.kv_relative_error(pairs, restored) < 0.02


def test_int8_handles_all_zero_vectors() -> None:
    x = torch.zeros(1, 2, 3, 8)
    x[0, 0, 0] = torch.linspace(-1, 1, 8)
    q = kv.quantize_kv_int8([(x, -x)])
    restored = kv.kv_pairs(kv.dequantize_kv_int8(q))[0][0]
    assert torch.isfinite(restored).all()
    assert (restored - x).abs().max() <= 1 / 254 + 1e-3


def test_bare_uint8_cast_is_not_a_quantisation(model: GPT2LMHeadModel) -> None:
    """Why the handout's `.to(torch.uint8)` scores zero: negatives wrap, nothing rescales."""
    cache = prefill(model, prompt(1, 8))
    cast = [(k.to(torch.uint8).float(), v.to(torch.uint8).float()) for k, v in kv.kv_pairs(cache)]
    assert kv.kv_relative_error(cache, cast) > 0.5


def test_dequantized_cache_continues_generation(model: GPT2LMHeadModel) -> None:
    ids = prompt(1, 16, seed=5)
    cache = prefill(model, ids[:, :-1])
    restored = kv.dequantize_kv_int8(kv.quantize_kv_int8(cache))
    want = kv.generate_with_cache_from(model, ids, cache, 12)
    got = kv.generate_with_cache_from(model, ids, restored, 12)
    assert got.shape == (1, 28)
    assert (got[:, 16:] == want[:, 16:]).float().mean() >= 0.9
    assert restored.get_seq_length() == 15 + 12


# ------------------------------------------------------------------- loading, report


def test_load_model_falls_back_to_random_weights_offline(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts: list[object] = []

    def no_network(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("network disabled in tests")

    waits: list[float] = []  # a retry with back-off would wait here, on any machine
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(time, "sleep", waits.append)
    model = kv.load_model("kv-lab-tests/not-a-cached-model")
    assert attempts == [] and waits == []
    assert "randomly initialised" in capsys.readouterr().err
    assert model.random_weights and not model.training
    assert kv.model_config_summary(model)["hidden_size"] == 768
    torch.manual_seed(123)
    again = kv.load_model("kv-lab-tests/not-a-cached-model")
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)  # seeded


def test_load_model_reads_local_weights_in_fp32(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=100)
    GPT2LMHeadModel(cfg).to(torch.float16).save_pretrained(tmp_path)
    capsys.readouterr()
    model = kv.load_model(str(tmp_path))
    assert not model.random_weights and not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert "randomly initialised" not in capsys.readouterr().err


def test_quick_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv, "load_model", lambda name="distilgpt2", device="cpu": small_model())
    path = kv.report(tmp_path / "out", quick=True)
    text = path.read_text()
    for heading in ("Task 1", "Task 4", "Task 5", "latency.png", "memory.png", "agreement"):
        assert heading in text
    for png in ("latency.png", "memory.png"):
        assert (tmp_path / "out" / png).read_bytes().startswith(PNG_SIGNATURE)


def small_model() -> GPT2LMHeadModel:
    """A narrow GPT-2 so that the report test takes a second, not ten."""
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256, vocab_size=500)
    model = GPT2LMHeadModel(cfg).eval()
    model.random_weights = True
    return model


# ------------------------------------------------------------------------ skeleton


def signatures(path: Path) -> dict[str, str]:
    """Every top-level function with its arguments and return annotation."""
    tree = ast.parse(path.read_text())
    return {
        node.name: f"({ast.unparse(node.args)}) -> {ast.unparse(node.returns or ast.Constant())}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def functions(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {n.name: ast.dump(n) for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_skeleton_keeps_every_name_and_signature() -> None:
    assert signatures(SKELETON_FILE) == signatures(SOLUTION_FILE)
    assert set(signatures(SOLUTION_FILE)) >= TODOS


def test_skeleton_provides_everything_else_unchanged() -> None:
    solution, skeleton = functions(SOLUTION_FILE), functions(SKELETON_FILE)
    for name in set(solution) - TODOS:
        assert skeleton[name] == solution[name], f"{name} differs from the solution's"
    for name in TODOS:
        assert skeleton[name] != solution[name], f"{name} is not a TODO in the skeleton"


def test_skeleton_todos_raise_and_load_model_works(model: GPT2LMHeadModel, tmp_path: Path) -> None:
    skel = import_path(SKELETON_FILE, "skeleton_kv_lab")
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=100)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    assert kv.model_config_summary(skel.load_model(str(tmp_path)))["hidden_size"] == 32
    ids, cache = prompt(1, 3), prefill(model, prompt(1, 3))
    calls = {
        "model_config_summary": (model,),
        "generate_no_cache": (model, ids, 1),
        "generate_with_cache": (model, ids, 1),
        "generate_with_cache_from": (model, ids, None, 1),
        "measure_latency": (model, (1,)),
        "theoretical_kv_bytes": (1, 768, 6),
        "measured_kv_bytes": (cache,),
        "quantize_kv_int8": (cache,),
        "dequantize_kv_int8": (kv.quantize_kv_int8(cache),),
        "quantized_kv_bytes": (kv.quantize_kv_int8(cache),),
    }
    assert set(calls) == TODOS
    for name, args in calls.items():
        with pytest.raises(NotImplementedError):
            getattr(skel, name)(*args)


def test_report_command_runs_offline_on_the_random_fallback(tmp_path: Path) -> None:
    """`python kv_lab.py --report OUT --quick --rounds 1` from a clean environment with no
    network: the distilgpt2-shaped random model, the Markdown report and both plots."""
    import os
    import subprocess

    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),  # an empty Hugging Face cache
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "kv_lab.py", "--report", str(out), "--quick", "--rounds", "1"],
        cwd=SOLUTION_FILE.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "randomly initialised distilgpt2-shaped" in proc.stderr
    text = (out / "report.md").read_text()
    assert "| n_layers | 6 |" in text and "36,864 bytes per token" in text
    assert "One run per figure" in text  # --rounds reached the report
    for png in ("latency.png", "memory.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_verdict_says_the_cache_won_or_where_it_lost() -> None:
    latency = {"L": [4, 8], "no_cache_ms_per_token": [10.0, 20.0], "cache_ms_per_token": [5.0, 5.0]}
    assert kv.latency_verdict(latency, []) == ["The cache was faster at every L."]
    latency["cache_ms_per_token"][1] = 25.0
    lines = kv.latency_verdict(latency, ["L = 8"])
    assert lines[0].startswith("WARNING: at L = 8 the timed runs of the two modes overlap")
    assert lines[1] == "The cache was NOT faster at L = 8."


def test_repeated_latency_takes_medians_and_flags_overlapping_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three rounds: the median of each figure; L = 8 overlaps (a cached run of 30 ms
    against a cache-free run of 25 ms), L = 4 does not."""
    rounds = iter([
        {"L": [4, 8], "no_cache_ms_per_token": [10.0, 25.0], "cache_ms_per_token": [2.0, 30.0]},
        {"L": [4, 8], "no_cache_ms_per_token": [12.0, 40.0], "cache_ms_per_token": [3.0, 5.0]},
        {"L": [4, 8], "no_cache_ms_per_token": [11.0, 41.0], "cache_ms_per_token": [4.0, 6.0]},
    ])  # fmt: skip
    calls = []

    def fake(model, L_values, warmup=1, repeats=3, device="cpu"):
        calls.append((warmup, repeats))
        return next(rounds)

    monkeypatch.setattr(kv, "measure_latency", fake)
    latency, noisy = kv.repeated_latency(None, (4, 8), rounds=3, device="cpu")
    assert latency == {
        "L": [4, 8],
        "no_cache_ms_per_token": [11.0, 40.0],
        "cache_ms_per_token": [3.0, 6.0],
    }
    assert noisy == ["L = 8"]
    assert calls == [(1, 1), (0, 1), (0, 1)]  # one warm-up, then one timed run per round
