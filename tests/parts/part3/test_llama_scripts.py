"""Tests of Part 3's driver scripts: solution/inference.py and solution/benchmark_inference.py.

Unit tests cover the memory figures (Llama 3.2-1B's 2858.13 MB of fp16 weights, built on
the ``meta`` device so nothing is allocated), exact-length prompts, the RSS sampler and the
table and plot writers; end-to-end tests run both scripts as subprocesses on the tiny
checkpoint in test_cases/public/part3/tiny_llama.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from grader.parts.part3.build import llama_on_path
from grader.ta.regen import import_path
from tests.conftest import ROOT, SOLUTION

TINY_CKPT = ROOT / "test_cases" / "public" / "part3" / "tiny_llama"
RECORD_KEYS = {
    "batch_size",
    "input_len",
    "output_len",
    "kv_caching",
    "inference_time",
    "tokens_per_second",
    "model_memory_mb",
    "peak_memory_mb",
    "generation",
}
SCRIPT_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """solution/benchmark_inference.py, with solution/ on sys.path for ``llama``. Any
    ``llama`` modules imported elsewhere are set aside meanwhile and restored afterwards."""

    with llama_on_path(SOLUTION):
        yield import_path(
            SOLUTION / "benchmark_inference.py", "part3_benchmark_inference_under_test"
        )


@pytest.fixture(scope="module")
def small_tokenizer(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory):
    from llama.tokenizer import Tokenizer, cl100k_path, write_truncated_bpe

    path = write_truncated_bpe(cl100k_path(), tmp_path_factory.mktemp("tok") / "t.model", 4096)
    return Tokenizer(str(path))


def run_script(script: str, *args: str, cwd: Path = SOLUTION) -> subprocess.CompletedProcess:
    """Run a solution script the way a student does, on the CPU. One thread: the tiny model
    gains nothing from more, and spinning OpenMP threads crawl on a busy machine."""
    proc = subprocess.run(
        [sys.executable, str(SOLUTION / script), "--ckpt-dir", str(TINY_CKPT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


# ------------------------------------------------------------------------------ unit tests


def test_llama32_1b_weights_are_2858_13_mb(bench: ModuleType) -> None:
    from llama.model import Llama

    with torch.device("meta"):
        model = Llama(bench.llama32_1b_args()).to(torch.float16)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 1_498_482_688
    assert round(bench.model_memory_mb(model), 2) == 2858.13
    assert bench.resident_tensor_mb(model) == 0.0  # meta tensors hold no memory


def test_resident_tensor_mb_counts_caches(bench: ModuleType) -> None:
    module = torch.nn.Linear(256, 256, bias=False)  # 256 KiB of fp32 weights
    assert bench.resident_tensor_mb(module) == pytest.approx(0.25)
    module.cache_k = torch.zeros(1024, 256)  # a plain tensor attribute, like a KV cache
    assert bench.resident_tensor_mb(module) == pytest.approx(1.25)


@pytest.mark.parametrize("input_len", [2, 16, 100, 256])
def test_exact_length_prompt(bench: ModuleType, small_tokenizer, input_len: int) -> None:
    prompt = bench.exact_length_prompt(small_tokenizer, input_len)
    assert len(small_tokenizer.encode(prompt, bos=True, eos=False)) == input_len
    assert (bench.STORY * input_len).startswith(prompt)


def test_rss_sampler_sees_a_transient_allocation(bench: ModuleType) -> None:
    import mmap

    size = 64 * 2**20
    with bench.rss_peak_sampler() as rss:
        # Fresh anonymous pages, each touched: resident whatever this process freed
        # before (a heap allocation could reuse memory that is already resident).
        block = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1
        time.sleep(0.5)  # long enough for the sampler thread even on a busy machine
        block.close()
    assert rss["peak"] - rss["start"] >= 48 * 2**20


def fake_records() -> list[dict]:
    return [
        {
            "batch_size": b,
            "input_len": 256,
            "output_len": 32,
            "kv_caching": caching,
            "device": "cpu",
            "inference_time": b * (0.1 if caching else 1.0),
            "tokens_per_second": 32 / (0.1 if caching else 1.0),
            "model_memory_mb": 2858.13,
            "peak_memory_mb": 3000.0 + b * (10 if caching else 20),
            "generation": "text",
        }
        for caching in (True, False)
        for b in (1, 8, 16)
    ]


def test_table_layout(bench: ModuleType, tmp_path: Path) -> None:
    text = bench.write_table(fake_records(), tmp_path / "t.md")
    assert (tmp_path / "t.md").read_text() == text
    lines = text.splitlines()
    assert "| KV caching | Batch size = 1 | Batch size = 8 | Batch size = 16 |" in lines
    assert "| With KV cache | 3010.00 MB / 0.100 s | 3080.00 MB / 0.800 s | " in text
    assert "| Without KV cache | 3020.00 MB / 1.000 s |" in text


def test_plot_is_a_png(bench: ModuleType, tmp_path: Path) -> None:
    bench.write_plot(fake_records(), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------- end to end on the tiny model


def test_tiny_checkpoint_is_present() -> None:
    for name in ("params.json", "consolidated.00.pth", "tokenizer.model"):
        assert (TINY_CKPT / name).is_file(), f"{TINY_CKPT / name} missing"


def test_default_checkpoint_is_the_tiny_one(bench: ModuleType) -> None:
    assert bench.default_ckpt_dir() == TINY_CKPT


def test_inference_script_runs_both_modes() -> None:
    proc = run_script("inference.py", "--device", "cpu", "--max-gen-len", "6", "--seed", "1")
    out = proc.stdout
    assert "Reloaded tiktoken model from" in out
    assert "===== with KV cache" in out and "===== without KV cache" in out
    for prompt in ("I believe the meaning of life is", "Translate English to French:"):
        assert out.count(prompt) == 2


def test_inference_script_greedy_modes_agree() -> None:
    """Greedy decoding must give the same text with and without the cache."""
    args = ["--device", "cpu", "--max-gen-len", "8", "--temperature", "0"]
    on = run_script("inference.py", *args, "--kv-caching", "on").stdout
    off = run_script("inference.py", *args, "--kv-caching", "off").stdout
    texts_on = [line for line in on.splitlines() if line.startswith("> ")]
    texts_off = [line for line in off.splitlines() if line.startswith("> ")]
    assert len(texts_on) == 4 and texts_on == texts_off


def test_inference_script_says_whether_the_modes_agreed() -> None:
    args = ["--device", "cpu", "--max-gen-len", "6", "--temperature", "0"]
    out = run_script("inference.py", *args).stdout
    assert "AGREE: both modes gave the same text for all 4 prompts." in out


def test_compare_modes_names_the_prompts_that_differ() -> None:
    with llama_on_path(SOLUTION):
        inference = import_path(SOLUTION / "inference.py", "part3_inference_under_test")
    verdict, agree = inference.compare_modes(["a", "b", "c"], ["a", "x", "c"], greedy=True)
    assert not agree and "prompt(s) 2 differ" in verdict and "--temperature 0" in verdict
    verdict, agree = inference.compare_modes(["a", "b"], ["a", "y"], greedy=False)
    assert not agree and "DIFFER on prompt(s) 2" in verdict
    assert inference.compare_modes(["a"], ["a"], greedy=False)[1]


def test_benchmark_sweep_writes_results(tmp_path: Path) -> None:
    proc = run_script(
        "benchmark_inference.py",
        *("--device", "cpu", "--batch-sizes", "1,2", "--input-len", "16", "--output-len", "4"),
        *("--out-dir", str(tmp_path)),
        cwd=tmp_path,
    )
    for line in ("Batch size: 2", "Input length: 16 tokens", "Output length: 4 tokens"):
        assert line in proc.stdout
    for prefix in ("Inference time:", "Tokens per second:", "Model weights memory usage:"):
        assert prefix in proc.stdout
    assert "Peak memory usage:" in proc.stdout and "=== Sample Output ===" in proc.stdout

    records = json.loads((tmp_path / "benchmark_results.json").read_text())
    assert len(records) == 4
    assert {(r["batch_size"], r["kv_caching"]) for r in records} == {
        (1, True),
        (2, True),
        (1, False),
        (2, False),
    }
    for r in records:
        assert set(r) >= RECORD_KEYS
        assert r["inference_time"] > 0 and r["model_memory_mb"] > 0
        assert r["peak_memory_mb"] >= r["model_memory_mb"]
        assert r["tokens_per_second"] == pytest.approx(r["batch_size"] * 4 / r["inference_time"])
    # Greedy decoding: both modes continue the prompt the same way.
    by_key = {(r["batch_size"], r["kv_caching"]): r["generation"] for r in records}
    assert by_key[(1, True)] == by_key[(1, False)]

    table = (tmp_path / "benchmark_table.md").read_text()
    assert "| With KV cache |" in table and "| Without KV cache |" in table
    assert "Batch size = 2" in table
    assert (tmp_path / "benchmark_plot.png").read_bytes()[:4] == b"\x89PNG"


def test_benchmark_single_run(tmp_path: Path) -> None:
    proc = run_script(
        "benchmark_inference.py",
        *("--single", "--device", "cpu", "--batch-size", "3", "--kv-caching", "off"),
        *("--input-len", "12", "--output-len", "3"),
        cwd=tmp_path,
    )
    assert "Batch size: 3" in proc.stdout and "KV caching: off" in proc.stdout
    assert not (tmp_path / "benchmark_results.json").exists()


def test_table_says_the_cache_won_and_warns_when_runs_overlap(bench: ModuleType) -> None:
    records = fake_records()
    assert bench.verdict(records) == ["The cache was faster at every batch size."]
    for r in records:  # batch 8: the slowest cached run as slow as the fastest cache-free one
        slow = r["batch_size"] == 8 and r["kv_caching"]
        r["inference_times"] = [r["inference_time"], 8.0 if slow else r["inference_time"]]
    lines = bench.verdict(records)
    assert lines[0].startswith("WARNING: at batch size 8 the timed runs of the two modes overlap")
    assert lines[1] == "The cache was faster at every batch size."  # medians still win


def test_table_says_where_the_cache_lost(bench: ModuleType) -> None:
    records = fake_records()
    for r in records:
        if r["batch_size"] == 1 and r["kv_caching"]:
            r["inference_time"] = 2.0
    assert bench.verdict(records)[-1] == "The cache was NOT faster at batch size 1."


def test_repeats_time_several_runs_and_keep_the_median(
    bench: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    record = bench.benchmark_inference(2, 12, 3, True, ckpt_dir=TINY_CKPT, repeats=3)
    assert len(record["inference_times"]) == 3
    assert record["inference_time"] == sorted(record["inference_times"])[1]
    assert "(median of 3 runs, spread" in capsys.readouterr().out
