"""Unit tests of Part 3's reference Llama: solution/llama/model.py and generation.py.

The model runs on the tiny checkpoint in test_cases/public/part3/tiny_llama (Meta's
layout: vocab 4352, dim 64, 2 layers, 4 query heads, 2 KV heads, scaled RoPE). The
cached and cache-free paths must agree on logits and on generated tokens; the cache
itself must hold the rotated keys at the positions each call wrote.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from grader.parts.part3.build import llama_on_path
from grader.parts.part3.cases import COURSE_PROMPTS, MODELS, checkpoint_shapes, plans
from grader.ta.regen import one_thread
from tests.conftest import ROOT, SOLUTION

TINY_CKPT = ROOT / "test_cases" / "public" / "part3" / "tiny_llama"
TOKENIZER = TINY_CKPT / "tokenizer.model"
VOCAB = 4352
MAX_SEQ_LEN = 128
MAX_BATCH = 4
ATOL = 1e-4
OTHER_PROMPTS = ["The capital of France is", "Once upon a time"]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def llm() -> Iterator[SimpleNamespace]:
    """solution/llama's model, generation and tokenizer modules, with solution/ on
    sys.path. Any ``llama`` modules imported elsewhere are set aside meanwhile and
    restored afterwards; torch runs on one thread (the tiny model gains nothing from
    more, and spinning threads crawl on a busy machine)."""

    with one_thread(), llama_on_path(SOLUTION):
        import llama.generation
        import llama.model
        import llama.tokenizer

        assert Path(llama.model.__file__).resolve() == SOLUTION / "llama" / "model.py"
        yield SimpleNamespace(
            model=llama.model, generation=llama.generation, tokenizer=llama.tokenizer
        )


def build(llm: SimpleNamespace, ckpt_dir: Path = TINY_CKPT, **kwargs):
    kwargs.setdefault("max_seq_len", MAX_SEQ_LEN)
    kwargs.setdefault("max_batch_size", MAX_BATCH)
    return llm.model.Llama.build(ckpt_dir, TOKENIZER, **kwargs)


@pytest.fixture(scope="module")
def built(llm: SimpleNamespace):
    """(model, tokenizer) on the tiny checkpoint; tests that need a fresh cache build
    their own model."""
    return build(llm)


@pytest.fixture
def fresh(llm: SimpleNamespace):
    return build(llm)[0]


def random_tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=gen)


def run_plan(model, tokens: torch.Tensor, plan: list[list[int]]) -> torch.Tensor:
    """Logits (B, T, vocab) of ``tokens`` fed to ``model`` call by call as ``plan`` says."""
    outs = []
    for start, n in plan:
        outs.append(model(tokens[:, start : start + n], start))
    return torch.cat(outs, dim=1)


# ------------------------------------------------------------------------- causal_mask


def test_causal_mask_none_for_one_token(llm: SimpleNamespace) -> None:
    assert llm.model.causal_mask(1, 0, torch.device("cpu")) is None
    assert llm.model.causal_mask(1, 7, torch.device("cpu")) is None


def test_causal_mask_with_cached_prefix(llm: SimpleNamespace) -> None:
    mask = llm.model.causal_mask(3, 5, torch.device("cpu"))
    assert mask is not None and mask.shape == (3, 8)
    assert torch.equal(mask[:, :5], torch.zeros(3, 5))
    for i in range(3):
        for j in range(8):
            expected = -math.inf if j > 5 + i else 0.0
            assert mask[i, j].item() == expected, (i, j)


def test_causal_mask_without_prefix(llm: SimpleNamespace) -> None:
    mask = llm.model.causal_mask(4, 0, torch.device("cpu"))
    expected = torch.full((4, 4), -math.inf).triu(1)
    assert mask is not None and torch.equal(mask, expected)


# --------------------------------------------------------------------------- repeat_kv


@pytest.mark.parametrize("n_rep", [2, 3])
def test_repeat_kv_repeats_each_head_consecutively(llm: SimpleNamespace, n_rep: int) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 4)  # (B, T, Hkv, D)
    out = llm.model.repeat_kv(x, n_rep)
    assert out.shape == (2, 5, 3 * n_rep, 4)
    for h in range(3):
        for r in range(n_rep):
            assert torch.equal(out[:, :, h * n_rep + r], x[:, :, h]), (h, r)


def test_repeat_kv_one_is_identity(llm: SimpleNamespace) -> None:
    x = torch.randn(2, 5, 3, 4)
    assert llm.model.repeat_kv(x, 1) is x


# ------------------------------------------------------------------------------- RoPE


@pytest.mark.parametrize("use_scaled", [False, True])
def test_precompute_freqs_cis(llm: SimpleNamespace, use_scaled: bool) -> None:
    dim, end, theta = 16, 40, 500000.0
    fc = llm.model.precompute_freqs_cis(dim, end, theta, use_scaled=use_scaled)
    assert fc.shape == (end, dim // 2) and fc.is_complex()
    assert torch.allclose(fc.abs(), torch.ones(end, dim // 2), atol=1e-6)
    assert torch.allclose(fc[0], torch.ones(dim // 2, dtype=fc.dtype))
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    if use_scaled:
        freqs = llm.model.apply_scaling(freqs)
    # Position p rotates by p·freq.
    for p in (1, 3):
        assert torch.allclose(fc[p], torch.polar(torch.ones_like(freqs), p * freqs), atol=1e-5)


def test_scaled_and_unscaled_rope_differ(llm: SimpleNamespace) -> None:
    plain = llm.model.precompute_freqs_cis(64, 8, 500000.0, use_scaled=False)
    scaled = llm.model.precompute_freqs_cis(64, 8, 500000.0, use_scaled=True)
    assert torch.allclose(plain[:, 0], scaled[:, 0])  # the highest frequency is kept
    assert not torch.allclose(plain[:, -1], scaled[:, -1], atol=1e-9, rtol=0)


def test_apply_scaling(llm: SimpleNamespace) -> None:
    freqs = 1.0 / 500000.0 ** (torch.arange(0, 64, 2).float() / 64)
    scaled = llm.model.apply_scaling(freqs)
    assert scaled.shape == freqs.shape
    wavelen = 2 * math.pi / freqs
    high = wavelen < 8192 / 4
    low = wavelen > 8192
    assert high.any() and low.any() and (~high & ~low).any()
    assert torch.equal(scaled[high], freqs[high])  # highest frequencies unchanged
    assert torch.allclose(scaled[low], freqs[low] / 32)  # lowest divided by 32
    assert scaled[0] == freqs[0]
    assert torch.isclose(scaled[-1], freqs[-1] / 32)
    mid = ~high & ~low  # smoothly blended in between
    assert (scaled[mid] < freqs[mid]).all() and (scaled[mid] > freqs[mid] / 32).all()


# ------------------------------------------------------------------------------ build


def test_build_loads_the_checkpoint(llm: SimpleNamespace, built) -> None:
    model, tokenizer = built
    assert isinstance(model, llm.model.Llama)
    assert isinstance(tokenizer, llm.tokenizer.Tokenizer)
    assert tokenizer.n_words == VOCAB and model.vocab_size == VOCAB
    assert model.params.vocab_size == VOCAB
    assert model.params.max_seq_len == MAX_SEQ_LEN
    assert model.params.max_batch_size == MAX_BATCH
    assert not model.training
    checkpoint = torch.load(TINY_CKPT / "consolidated.00.pth", weights_only=True)
    own = model.state_dict()
    assert set(own) == set(checkpoint)
    for key, value in checkpoint.items():
        assert torch.equal(own[key], value), key


def copy_checkpoint(dest: Path) -> Path:
    shutil.copytree(TINY_CKPT, dest)
    return dest


def test_build_rejects_unknown_params_key(llm: SimpleNamespace, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tmp_path / "ckpt")
    params = json.loads((ckpt / "params.json").read_text())
    params["bogus_setting"] = 3
    (ckpt / "params.json").write_text(json.dumps(params))
    with pytest.raises(ValueError, match="bogus_setting"):
        build(llm, ckpt)


@pytest.mark.parametrize("missing", ["consolidated.00.pth", "params.json"])
def test_build_names_a_missing_file(llm: SimpleNamespace, tmp_path: Path, missing: str) -> None:
    ckpt = copy_checkpoint(tmp_path / "ckpt")
    (ckpt / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")):
        build(llm, ckpt)


def test_build_names_a_misshaped_tensor(llm: SimpleNamespace, tmp_path: Path) -> None:
    ckpt = copy_checkpoint(tmp_path / "ckpt")
    checkpoint = torch.load(ckpt / "consolidated.00.pth", weights_only=True)
    name = "layers.1.attention.wk.weight"
    rows, cols = checkpoint[name].shape
    checkpoint[name] = torch.zeros(rows + 16, cols)
    torch.save(checkpoint, ckpt / "consolidated.00.pth")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")) as info:
        build(llm, ckpt)
    assert "layers.0.attention.wk.weight" not in str(info.value)


# ---------------------------------------------------------------------------- forward


def test_forward_without_cache(llm: SimpleNamespace, fresh) -> None:
    fresh.set_kv_caching(False)
    tokens = random_tokens(2, 9)
    logits = fresh(tokens, 0)
    assert logits.shape == (2, 9, VOCAB) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # Causal: the logits of a prefix do not depend on the tokens after it.
    assert torch.allclose(fresh(tokens[:, :5], 0), logits[:, :5], atol=ATOL)
    assert all(layer.attention.cache_k is None for layer in fresh.layers)


@pytest.mark.parametrize("length", [7, 12])
def test_cached_plans_match_no_cache(llm: SimpleNamespace, length: int) -> None:
    model = build(llm)[0]
    tokens = random_tokens(2, length, seed=length)
    schedule = plans(length)
    model.set_kv_caching(False)
    reference = run_plan(model, tokens, schedule["no_cache"])
    assert reference.shape == (2, length, VOCAB)
    model.set_kv_caching(True)
    for mode in ("cached", "chunked"):
        logits = run_plan(model, tokens, schedule[mode])
        assert logits.shape == reference.shape, mode
        err = (logits - reference).abs().max().item()
        assert err < ATOL, f"{mode}: max |diff| {err}"
    # The logits spread widely, so a wrong position or mask would show.
    assert reference.std() > 0.5


def test_batch_row_equals_the_sequence_alone(llm: SimpleNamespace, fresh) -> None:
    tokens = random_tokens(3, 10, seed=5)
    plan = plans(10)["cached"]
    batch = run_plan(fresh, tokens, plan)
    for row in range(3):
        alone = run_plan(fresh, tokens[row : row + 1], plan)
        assert torch.allclose(batch[row : row + 1], alone, atol=ATOL), row


def test_cache_holds_rotated_keys(llm: SimpleNamespace, fresh) -> None:
    inputs: dict[int, torch.Tensor] = {}

    def grab(module, args):
        inputs[id(module)] = args[0]  # the normed input x of the attention layer

    handles = [layer.attention.register_forward_pre_hook(grab) for layer in fresh.layers]
    tokens = random_tokens(2, 6, seed=9)
    try:
        fresh(tokens[:, :4], 0)
        first = {k: v.clone() for k, v in inputs.items()}
        fresh(tokens[:, 4:6], 4)
    finally:
        for h in handles:
            h.remove()

    head_dim = 64 // 4
    for layer in fresh.layers:
        att = layer.attention
        assert att.cache_k.shape == (MAX_BATCH, MAX_SEQ_LEN, 2, head_dim)
        assert att.cache_v.shape == (MAX_BATCH, MAX_SEQ_LEN, 2, head_dim)
        for x, start in ((first[id(att)], 0), (inputs[id(att)], 4)):
            bsz, seqlen, _ = x.shape
            with torch.inference_mode():
                xq = att.wq(x).view(bsz, seqlen, 4, head_dim)
                xk = att.wk(x).view(bsz, seqlen, 2, head_dim)
                xv = att.wv(x).view(bsz, seqlen, 2, head_dim)
                freqs = fresh.freqs_cis[start : start + seqlen]
                _, xk = llm.model.apply_rotary_emb(xq, xk, freqs)
            written = slice(start, start + seqlen)
            assert torch.allclose(att.cache_k[:bsz, written], xk, atol=1e-5)
            assert torch.allclose(att.cache_v[:bsz, written], xv, atol=1e-5)
            assert (att.cache_k[:bsz, written].abs().sum(-1) > 0).all()
        assert not att.cache_k[:, 6:].any() and not att.cache_v[:, 6:].any()
        assert not att.cache_k[2:].any()  # rows beyond the batch stay untouched


def test_set_kv_caching_off_frees_the_cache(llm: SimpleNamespace, fresh) -> None:
    tokens = random_tokens(1, 5, seed=3)
    with_cache = fresh(tokens, 0)
    assert all(layer.attention.cache_k is not None for layer in fresh.layers)
    fresh.set_kv_caching(False)
    assert fresh.params.kv_caching is False
    for layer in fresh.layers:
        assert layer.attention.kv_caching is False
        assert layer.attention.cache_k is None and layer.attention.cache_v is None
    without = fresh(tokens, 0)
    assert torch.allclose(with_cache, without, atol=ATOL)
    assert all(layer.attention.cache_k is None for layer in fresh.layers)


# --------------------------------------------------------------------------- generate


def generate(model, tokenizer, prompts=COURSE_PROMPTS, seed=0, **kwargs):
    kwargs.setdefault("max_gen_len", 8)
    kwargs.setdefault("temperature", 0.0)
    kwargs.setdefault("top_p", 0.9)
    torch.manual_seed(seed)
    return model.generate(tokenizer, list(prompts), device="cpu", **kwargs)


def tokens_of(results) -> list[list[int]]:
    return [r["tokens"] for r in results]


def test_generate_returns_one_dict_per_prompt(built) -> None:
    model, tokenizer = built
    results = generate(model, tokenizer, kv_caching=True)
    assert len(results) == len(COURSE_PROMPTS)
    for r in results:
        assert isinstance(r["generation"], str)
        assert isinstance(r["tokens"], list) and 0 < len(r["tokens"]) <= 8
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in r["tokens"])
        assert r["generation"] == tokenizer.decode(r["tokens"])
        assert tokenizer.eos_id not in r["tokens"] and tokenizer.eot_id not in r["tokens"]


def test_ragged_prompts(built) -> None:
    _, tokenizer = built
    lengths = [len(tokenizer.encode(p, bos=True, eos=False)) for p in COURSE_PROMPTS]
    assert len(set(lengths)) == len(lengths)  # the course prompts really are ragged


@pytest.mark.parametrize(
    ("temperature", "top_p"), [(0.0, 0.9), (0.8, 0.9)], ids=["greedy", "sampled"]
)
def test_generate_cache_matches_no_cache(built, temperature: float, top_p: float) -> None:
    model, tokenizer = built
    kw = {"temperature": temperature, "top_p": top_p, "max_gen_len": 10}
    cached = tokens_of(generate(model, tokenizer, seed=7, kv_caching=True, **kw))
    plain = tokens_of(generate(model, tokenizer, seed=7, kv_caching=False, **kw))
    assert cached == plain
    assert any(len(t) == 10 for t in cached)


def test_sampling_depends_on_the_seed(built) -> None:
    model, tokenizer = built
    kw = {"temperature": 0.8, "top_p": 0.9, "max_gen_len": 10, "kv_caching": True}
    runs = {str(tokens_of(generate(model, tokenizer, seed=s, **kw))) for s in range(3)}
    assert len(runs) > 1


def record_calls(model, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    original = model.forward

    def forward(tokens: torch.Tensor, start_pos: int) -> torch.Tensor:
        calls.append((start_pos, tokens.shape[1]))
        return original(tokens, start_pos)

    monkeypatch.setattr(model, "forward", forward)
    return calls


@pytest.mark.parametrize("kv_caching", [True, False])
def test_generate_forward_calls(built, monkeypatch: pytest.MonkeyPatch, kv_caching: bool) -> None:
    model, tokenizer = built
    monkeypatch.setattr(tokenizer, "stop_tokens", {-7})  # never generated: no early stop
    min_len = min(len(tokenizer.encode(p, bos=True, eos=False)) for p in COURSE_PROMPTS)
    max_len = max(len(tokenizer.encode(p, bos=True, eos=False)) for p in COURSE_PROMPTS)
    calls = record_calls(model, monkeypatch)
    results = generate(model, tokenizer, kv_caching=kv_caching, max_gen_len=6)
    assert all(len(r["tokens"]) == 6 for r in results)
    positions = list(range(min_len, max_len + 6))  # cur_pos of every step
    if kv_caching:
        assert calls == [(0, min_len)] + [(p, 1) for p in positions[:-1]]
    else:
        assert calls == [(0, p) for p in positions]


def test_second_generate_matches_a_fresh_model(llm: SimpleNamespace) -> None:
    model, tokenizer = build(llm)
    generate(model, tokenizer, kv_caching=True, max_gen_len=12)
    again = tokens_of(generate(model, tokenizer, OTHER_PROMPTS, kv_caching=True))
    new_model, _ = build(llm)
    fresh_tokens = tokens_of(generate(new_model, tokenizer, OTHER_PROMPTS, kv_caching=True))
    assert again == fresh_tokens
    # ... and after a cache-free run, the cache comes back and still agrees.
    generate(model, tokenizer, kv_caching=False)
    assert tokens_of(generate(model, tokenizer, OTHER_PROMPTS, kv_caching=True)) == fresh_tokens


@pytest.mark.parametrize("kv_caching", [True, False])
def test_generate_stops_at_a_stop_token(
    built, monkeypatch: pytest.MonkeyPatch, kv_caching: bool
) -> None:
    model, tokenizer = built
    prompt = COURSE_PROMPTS[:1]
    full = generate(model, tokenizer, prompt, kv_caching=kv_caching, max_gen_len=10)[0]
    # Declare the 4th generated token a stop token (cut at its first occurrence).
    stop = full["tokens"][3]
    cut = full["tokens"].index(stop)
    monkeypatch.setattr(tokenizer, "stop_tokens", {stop, tokenizer.eos_id})
    calls = record_calls(model, monkeypatch)
    stopped = generate(model, tokenizer, prompt, kv_caching=kv_caching, max_gen_len=10)[0]
    assert stopped["tokens"] == full["tokens"][:cut]
    assert stop not in stopped["tokens"]
    assert stopped["generation"] == tokenizer.decode(full["tokens"][:cut])
    assert len(calls) == cut + 1  # the loop ends once every row has stopped


def test_generate_stop_token_in_a_batch_keeps_other_rows(
    built, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = built
    full = tokens_of(generate(model, tokenizer, kv_caching=True, max_gen_len=10))
    stop = full[0][2]
    monkeypatch.setattr(tokenizer, "stop_tokens", {stop})
    stopped = tokens_of(generate(model, tokenizer, kv_caching=True, max_gen_len=10))
    for got, whole in zip(stopped, full, strict=True):
        expected = whole[: whole.index(stop)] if stop in whole else whole
        assert got == expected


@pytest.mark.parametrize("kv_caching", [True, False])
def test_ragged_batch_matches_each_prompt_alone(built, kv_caching: bool) -> None:
    model, tokenizer = built
    batch = tokens_of(generate(model, tokenizer, kv_caching=kv_caching, max_gen_len=6))
    for prompt, got in zip(COURSE_PROMPTS, batch, strict=True):
        alone = tokens_of(
            generate(model, tokenizer, [prompt], kv_caching=kv_caching, max_gen_len=6)
        )
        assert got == alone[0], prompt


def test_stop_token_inside_a_longer_prompt_does_not_stop_it(
    built, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt's own tokens never count as stops, even while a shorter row generates."""
    model, tokenizer = built
    short, long = COURSE_PROMPTS[0], COURSE_PROMPTS[3]
    n_short = len(tokenizer.encode(short, bos=True, eos=False))
    long_ids = tokenizer.encode(long, bos=True, eos=False)
    first_short = generate(model, tokenizer, [short], kv_caching=True, max_gen_len=1)[0]
    stops = {first_short["tokens"][0], long_ids[n_short + 1]}
    monkeypatch.setattr(tokenizer, "stop_tokens", stops)
    batch = tokens_of(generate(model, tokenizer, [short, long], kv_caching=True, max_gen_len=6))
    alone = tokens_of(generate(model, tokenizer, [long], kv_caching=True, max_gen_len=6))
    assert batch[0] == []
    assert batch[1] == alone[0] and len(alone[0]) > 0


def test_generate_rejects_too_many_prompts(built) -> None:
    model, tokenizer = built
    prompts = ["hello"] * (MAX_BATCH + 1)
    with pytest.raises(ValueError, match="max_batch_size"):
        generate(model, tokenizer, prompts, kv_caching=True)


# ------------------------------------------------------------------------- sample_top_p


def test_sample_top_p_keeps_the_nucleus(llm: SimpleNamespace) -> None:
    torch.manual_seed(0)
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]).repeat(500, 1)
    out = llm.generation.sample_top_p(probs, 0.75)
    assert out.shape == (500, 1) and out.dtype == torch.long
    assert set(out.flatten().tolist()) == {0, 1}
    # The input is left as it was.
    assert torch.equal(probs[0], torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04]))


def test_sample_top_p_per_row(llm: SimpleNamespace) -> None:
    torch.manual_seed(1)
    rows = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04], [0.05, 0.05, 0.6, 0.2, 0.1]])
    out = llm.generation.sample_top_p(rows.repeat(250, 1), 0.75)
    assert out.shape == (500, 1)
    assert set(out[0::2].flatten().tolist()) == {0, 1}
    assert set(out[1::2].flatten().tolist()) == {2, 3}


def test_sample_top_p_one_can_draw_every_token(llm: SimpleNamespace) -> None:
    torch.manual_seed(2)
    probs = torch.tensor([[0.5, 0.3, 0.0, 0.1, 0.06, 0.04]]).repeat(500, 1)
    out = llm.generation.sample_top_p(probs, 1.0)
    assert out.shape == (500, 1)
    assert set(out.flatten().tolist()) == {0, 1, 3, 4, 5}  # never the zero-probability one


def test_next_token_greedy_is_argmax(llm: SimpleNamespace) -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert llm.generation.next_token(logits, 0.0, 0.9).tolist() == [1, 0]


# ------------------------------------------------------------------------- state dict


@pytest.mark.parametrize("name", sorted(MODELS))
def test_state_dict_matches_checkpoint_shapes(llm: SimpleNamespace, name: str) -> None:
    params, _seed = MODELS[name]
    model = llm.model.Llama(llm.model.ModelArgs(**params, vocab_size=VOCAB))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes == checkpoint_shapes(params, VOCAB)
