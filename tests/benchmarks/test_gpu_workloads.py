"""benchmarks/gpu_workloads.py: the partial caches it times against the reference are
caches that work (same tokens as the reference's cached and cache-free paths), so their
times are those of real designs, and the measurement records every variant."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from grader.parts.part3.build import llama_on_path
from grader.ta.regen import import_path
from tests.conftest import ROOT, SOLUTION


@pytest.fixture(scope="module")
def workloads() -> Iterator[ModuleType]:
    with llama_on_path(SOLUTION):
        yield import_path(ROOT / "benchmarks" / "gpu_workloads.py", "gpu_workloads_under_test")


def test_part2_partial_caches_give_the_reference_tokens(workloads: ModuleType) -> None:
    torch.manual_seed(0)
    model = workloads.DecoderOnlyTransformer(50, 32, 64, 2, 64).eval()
    prompt = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(1))
    variants = workloads.part2_variants(model, prompt, 20)  # 20 steps: the refeed runs
    assert set(variants) == {"cached", "cache_free", "recompute_every_8", "refeed_last_16"}
    tokens = {name: fn().tolist() for name, fn in variants.items()}
    assert len(tokens["cached"][0]) == 40
    assert all(t == tokens["cache_free"] for t in tokens.values()), tokens


def test_part3_partial_cache_gives_the_reference_tokens(workloads: ModuleType) -> None:
    from llama.model import Llama, ModelArgs

    torch.manual_seed(0)
    args = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64,
                     multiple_of=16, max_batch_size=2, max_seq_len=40)  # fmt: skip
    model = Llama(args).eval()
    prompts = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(2)).tolist()
    variants = workloads.part3_variants(model, prompts, 10, "cpu")
    cached, free = variants["cached"](), variants["cache_free"]()
    partial = variants["recompute_every_8"]()[:, 12:].tolist()
    assert cached == free  # the new tokens only, as Meta's generate returns them
    assert len(cached[0]) == 10
    assert partial == cached


def test_compare_reports_every_variant_from_the_timed_rounds(workloads: ModuleType) -> None:
    calls: list[str] = []
    variants = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    result = workloads.compare(variants, "cpu", repeats=3)
    assert calls == ["a", "b"] * 4  # a warm-up round, then 3 interleaved rounds
    assert set(result) == {"a", "b"}
    for r in result.values():
        assert 0 <= r["min_s"] <= r["median_s"] <= r["max_s"]
