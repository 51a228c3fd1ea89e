"""benchmarks/reference_mbu.py: the bytes a decode step reads, and the same model in
Hugging Face transformers (weights mapped, rotary layout permuted) giving the same logits."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from grader.parts.part3.build import llama_on_path
from grader.ta.regen import import_path
from tests.conftest import ROOT, SOLUTION

TINY = dict(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32,
    ffn_dim_multiplier=1.5, norm_eps=1e-5, rope_theta=500000.0, use_scaled_rope=True,
)  # fmt: skip


@pytest.fixture(scope="module")
def mbu() -> Iterator[ModuleType]:
    with llama_on_path(SOLUTION):
        yield import_path(ROOT / "benchmarks" / "reference_mbu.py", "reference_mbu_under_test")


def test_bytes_per_token_of_the_1b_shape(mbu: ModuleType) -> None:
    from llama.model import Llama, ModelArgs

    with torch.device("meta"):
        model = Llama(ModelArgs(**mbu.LLAMA_32_1B, max_batch_size=1, max_seq_len=64))
    # 1,498,482,688 parameters, less the 128256 x 2048 embedding table, plus its one row.
    weights = 1_498_482_688 - 128_256 * 2048 + 2048
    assert mbu.bytes_per_token(model, 0, torch.float32) == weights * 4
    kv_per_position = 2 * 16 * 8 * 64  # K and V, 16 layers, 8 KV heads of 64
    assert mbu.bytes_per_token(model, 10, torch.bfloat16) == (weights + 10 * kv_per_position) * 2


def test_transformers_llama_matches_the_reference(mbu: ModuleType) -> None:
    torch.manual_seed(0)
    reference = mbu.build_reference(torch.float32, "cpu", 64, shape=TINY)
    hf = mbu.build_hf(reference, torch.float32, "cpu")
    prompt = torch.randint(
        0, TINY["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(3)
    )
    with torch.inference_mode():
        ours = reference(prompt, 0)
        theirs = hf(input_ids=prompt).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    ref_tokens, _ = mbu.decode_reference(reference, prompt, 10, "cpu")
    hf_tokens, _ = mbu.decode_hf(hf, prompt, 10, "cpu")
    assert torch.equal(ref_tokens, hf_tokens)


def test_unpermuted_rotary_weights_would_disagree(mbu: ModuleType) -> None:
    w = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    permuted = mbu.permute_rotary(w, n_heads=2)
    assert not torch.equal(permuted, w)
    # Per head, the even rows (first of each pair) come first, then the odd rows.
    assert permuted[:2].tolist() == [w[0].tolist(), w[2].tolist()]
    assert permuted[2:4].tolist() == [w[1].tolist(), w[3].tolist()]


def test_each_kernel_counts_the_bytes_it_reads_and_writes(mbu: ModuleType, monkeypatch) -> None:
    ticks = iter(range(20))  # a clock that advances 1 s per reading
    monkeypatch.setattr(mbu.time, "perf_counter", lambda: float(next(ticks)))
    array = 2**30 / 64  # bytes of one array
    rates = mbu.stream_kernels("cpu", gib=1 / 64)
    assert rates == {"copy": 2 * array, "scale": 2 * array, "add": 3 * array, "triad": 3 * array}


def test_random_checkpoint_loads_with_the_real_vocabulary(tmp_path) -> None:
    with llama_on_path(SOLUTION):
        writer = import_path(
            ROOT / "benchmarks" / "random_llama_checkpoint.py", "random_checkpoint_under_test"
        )
        from llama.model import Llama

        params = {**TINY, "vocab_size": 128_256}
        ckpt = writer.write_checkpoint(tmp_path / "ckpt", torch.float32, params)
        model, tokenizer = Llama.build(ckpt, ckpt / "tokenizer.model", 32, 2)
    assert tokenizer.n_words == model.params.vocab_size == 128_256
    assert model.tok_embeddings.weight.shape == (128_256, 64)
    # cl100k's ranks are kept: the course prompt still encodes to real Llama 3 ids.
    assert tokenizer.encode("Hello", bos=False, eos=False) == [9906]
    assert isinstance(tokenizer.decode([127_999, 100_300]), str)  # placeholders decode
    out = model.generate(tokenizer, ["Hi"], max_gen_len=4, temperature=0.0, device="cpu")
    assert isinstance(out[0]["generation"], str)


def test_profile_names_where_decode_time_goes(mbu: ModuleType) -> None:
    reference = mbu.build_reference(torch.float32, "cpu", 64, shape=TINY)
    prompt = torch.randint(
        0, TINY["vocab_size"], (1, 4), generator=torch.Generator().manual_seed(4)
    )
    rows = mbu.profile_decode(reference, prompt, "cpu", top=5)
    assert len(rows) == 5
    assert rows[0]["ms"] >= rows[-1]["ms"] and all(r["calls"] >= 1 for r in rows)
