"""Part 3 data: tiny Llama checkpoints in Meta's layout, made from seeded weights and a
truncated copy of the real cl100k_base BPE file (Llama 3's first 100k tokens).

The public checkpoint (``test_cases/public/part3/tiny_llama/``) is what students
run ``inference.py`` and ``benchmark_inference.py`` on; the hidden one has other
sizes (more query heads per KV head) and weights. Both are written by
``python -m grader regen`` and checked by its manifest.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from grader.core.thresholds import probe_thresholds, timed_rounds
from grader.parts.part3.adapter_weights import checkpoint_shapes, weight_scale

N_RANKS = 4096  # BPE ranks kept from cl100k_base: 4096 + 256 special tokens = 4352 ids
ATOL = 1e-4  # logits of a float32 model on a CPU agree far better than this

TINY_PARAMS: dict[str, Any] = {
    "dim": 64,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "multiple_of": 32,
    "ffn_dim_multiplier": 1.5,
    "norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
}
HIDDEN_PARAMS: dict[str, Any] = {
    "dim": 96,
    "n_layers": 3,
    "n_heads": 6,
    "n_kv_heads": 2,
    "multiple_of": 64,
    "ffn_dim_multiplier": 1.3,
    "norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "use_scaled_rope": True,
}
# sample_top_p probe: with p = 0.75 the smallest sets reaching p are {0, 1} and {2, 3}.
TOP_P = 0.75
TOP_P_PROBS = [[0.5, 0.3, 0.1, 0.06, 0.04], [0.05, 0.05, 0.6, 0.2, 0.1]]
TOP_P_NUCLEUS = [[0, 1], [2, 3]]
MODELS = {"public": (TINY_PARAMS, 3101), "hidden": (HIDDEN_PARAMS, 3202)}

MAX_SEQ_LEN, MAX_BATCH = 128, 4  # the public and hidden models' cache (max_seq_len, rows)
#: The settings of the generate checks (3.5, 3.6, 3.8, 3.9).
GENERATE = {"max_gen_len": 16, "temperature": 0.0, "top_p": 0.9, "seed": 0}
BENCH_MAX_SEQ_LEN, BENCH_MAX_BATCH = 320, 16  # the benchmark's model: the public weights
POOL_SEED = 70707  # the timed runs' prompts (hidden), see build_pools.bench_pools()
# A profile's own benchmark model (a GPU workload, "workload" in the checks): the public
# checkpoint's params with the profile's sizes, seeded weights, the public tokenizer.
WORKLOAD_SEED = 2323
TOKENIZER_VOCAB = N_RANKS + 256  # the public tokenizer's ids: its ranks and special tokens
POOL_MIN_GAP = 1e-3  # every expected greedy step wins by at least this (logits)
# Check 3.7's work probe: rounds of one cached and one cache-free generate of WORK_NEW
# tokens after WORK_BATCH prompts of WORK_PROMPT tokens, on the CPU, in CPU time. The
# reference measured 5.2x (4.9-6.2x) on one thread, 4.4x (3.4-8.7x) graded on a busy
# machine; a cached path that recomputes the prefix and projects only its last position
# 1.7x (1.7-1.9x), one that recomputes it all about 1x. Check 3.11 separates the former.
WORK_ROUNDS, WORK_BATCH, WORK_PROMPT, WORK_NEW = 3, 4, 32, 96
MIN_WORK_RATIO = probe_thresholds("part3")["min_work_ratio"]  # thresholds.toml [probes.part3]
# Check 3.7's growth probe: the cached path alone. Rounds of one cached generate of
# GROWTH_SHORT and one of GROWTH_LONG new tokens after GROWTH_BATCH prompts of
# GROWTH_PROMPT tokens (fresh ones every run) on the work model, in CPU time. Its CPU time
# per new token, long over short, must stay within MAX_CACHED_GROWTH: with a cache every
# step costs about the same, while recomputing the prefix makes the long run's steps
# dearer, however slow the submission makes its own cache-free path (which the work ratio
# above and check 3.11 compare against). A short prompt and a long generation widen the
# gap: a cached step is dominated by constants (the vocabulary projection, per-call
# overhead), a recomputing one by the layers over every position so far.
GROWTH_BATCH, GROWTH_PROMPT, GROWTH_SHORT, GROWTH_LONG = 8, 8, 16, 256  # 264 <= 320 positions
GROWTH_ROUNDS = 3  # after a first round that was not decided (see growth_probe)
# CPU time per new token, GROWTH_LONG run over GROWTH_SHORT run: [probes.part3] too
MAX_CACHED_GROWTH = probe_thresholds("part3")["max_cached_growth"]
# Check 3.1's capacity probe (seeded tokens): max_batch_size rows of max_seq_len tokens,
# prefill then one token per call, so the cached model writes and reads its last slot.
CAPACITY_SEED = 4141
# Check 3.1's memory probe: the public weights with a cache large enough (32 MiB) to show
# in the worker's resident memory, which the grader reads from the kernel (on the CPU).
MEMORY_MAX_BATCH, MEMORY_MAX_SEQ_LEN = 16, 4096
# Check 3.1's cache-size probe: what building a model with kv_caching=True and one cached
# generate on it add to the resident memory, less the same without the cache, over the
# bytes of a cache of n_kv_heads heads, must stay within this factor: the reference adds
# its cache (about 1x), a cache of n_heads heads (GQA expanded before the cache) 2x on
# the public model (4 query heads per 2 KV heads).
MAX_CACHE_MEMORY_RATIO = 1.5
# Check 3.5's full batch: max_batch_size prompts, the longest exactly max_seq_len tokens.
FULL_SEED = 5353
# Check 3.5's stop batch: two prompts of STOP_PROMPT tokens, STOP_NEW new tokens; the
# first one's greedy continuation reaches a stop token, which generate must cut off.
STOP_SEED, STOP_PROMPT, STOP_NEW = 6464, 32, 40
MIB = 1024 * 1024


def cache_bytes(params: dict[str, Any], batch: int, seq_len: int) -> int:
    """Bytes of a float32 model's preallocated caches: keys and values of every layer,
    each (batch, seq_len, n_kv_heads, head_dim)."""
    head_dim = params["dim"] // params["n_heads"]
    return 2 * params["n_layers"] * batch * seq_len * params["n_kv_heads"] * head_dim * 4


def pool_key(input_len: int, output_len: int, sizes: dict[str, Any] | None = None) -> str:
    """The key of the timed runs' prompt pool for a benchmark of these lengths (and, for
    a profile with a benchmark model of its own, of that model's sizes)."""
    key = f"{input_len}x{output_len}"
    return key + "@" + "x".join(f"{k}={v}" for k, v in sorted(sizes.items())) if sizes else key


def row_gaps(step_logits: np.ndarray) -> np.ndarray:
    """Each row's smallest best-minus-runner-up logit over the steps of a batched greedy
    generation: ``step_logits`` (steps, B, vocab) -> (B,)."""
    top2 = np.sort(step_logits, axis=-1)[..., -2:]  # (steps, B, 2)
    return (top2[..., 1] - top2[..., 0]).min(axis=0)


def growth_key(new_tokens: int) -> str:
    """The key of check 3.7's growth probe pool for runs of ``new_tokens`` new tokens."""
    return f"growth {pool_key(GROWTH_PROMPT, new_tokens)}"


def pool_size(bench: dict[str, Any]) -> int:
    """Prompts one grading consumes at most: one per row of every timed run of check
    3.11 (every round, both modes, every batch size)."""
    return 2 * timed_rounds(bench) * sum(bench["batch_sizes"])


COURSE_PROMPTS = [
    "I believe the meaning of life is",
    "Simply put, the theory of relativity states that ",
    "A brief message congratulating the team on the launch:\n\n"
    "        Hi everyone,\n\n        I just ",
    "Translate English to French:\n\n        sea otter => loutre de mer\n"
    "        peppermint => menthe poivrée\n        plush girafe => girafe peluche\n"
    "        cheese =>",
]


def make_weights(params: dict[str, Any], vocab: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 weights, scaled so attention is sharp and logits spread
    (:func:`~grader.parts.part3.adapter_weights.weight_scale`)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in checkpoint_shapes(params, vocab).items():
        mean, std = weight_scale(name, shape)
        weights[name] = (mean + std * rng.standard_normal(shape)).astype(np.float32)
    return weights


def checkpoint_files(name: str, tokenizer_bytes: bytes, vocab: int) -> dict[str, bytes]:
    """``params.json``, ``consolidated.00.pth`` and ``tokenizer.model`` of model ``name``."""
    import torch

    params, seed = MODELS[name]
    weights = make_weights(params, vocab, seed)
    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(v) for k, v in weights.items()}, buf)
    return {
        "params.json": (json.dumps(params, indent=2, sort_keys=True) + "\n").encode(),
        "consolidated.00.pth": buf.getvalue(),
        "tokenizer.model": tokenizer_bytes,
    }


def plans(length: int) -> dict[str, list[list[int]]]:
    """Forward plans (start_pos, length) per mode for a sequence of ``length`` tokens."""
    k = max(2, length // 3)
    chunk = [[0, k]]
    while sum(n for _, n in chunk) < length:
        start = sum(n for _, n in chunk)
        chunk.append([start, min(4, length - start)])
    return {
        "no_cache": [[0, length]],
        "cached": [[0, k]] + [[t, 1] for t in range(k, length)],
        "chunked": chunk,
    }


# -------------------------------------------------------- sampling at a temperature

#: generate's sampling probe: the first token of one prompt, drawn SAMPLE_CALLS x
#: SAMPLE_ROWS times (seeds 0, 1, ...) at SAMPLE_TEMPERATURE with top_p = SAMPLE_TOP_P.
SAMPLE_PROMPT = "Simply put, the theory of relativity states that "
SAMPLE_TEMPERATURE = 0.6
SAMPLE_TOP_P = 0.9
SAMPLE_ROWS, SAMPLE_CALLS = 16, 32
SAMPLE_SIGMAS = 6.0  # half-width of the accepted band for the top text's frequency


def nucleus_distribution(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """Meta's sampling distribution: softmax(logits / T), cut to the smallest set of
    tokens whose probabilities reach ``top_p`` (the crossing token kept), renormalised."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    kept = p[order].copy()
    kept[(np.cumsum(kept) - kept) > top_p] = 0.0
    out = np.zeros_like(p)
    out[order] = kept / kept.sum()
    return out


def text_distribution(probs: np.ndarray, text_of: list[str]) -> dict[str, float]:
    """Probabilities by generated text (ids that read the same are merged)."""
    out: dict[str, float] = {}
    for token in np.flatnonzero(probs):
        out[text_of[token]] = out.get(text_of[token], 0.0) + float(probs[token])
    return out


def sampling_band(logits: np.ndarray, text_of: list[str]) -> dict[str, Any] | None:
    """What ``generate(temperature=0.6, top_p=0.9)`` must draw as its first token where
    the model's last-position logits are ``logits``: the texts it may read, and a band
    for the frequency of the likeliest one. None where a sampler that ignores the
    temperature, or is always greedy, could pass it (neither outside the band nor
    drawing a text outside the nucleus), so the probe could not tell them apart."""
    n = SAMPLE_ROWS * SAMPLE_CALLS
    want = text_distribution(
        nucleus_distribution(logits, SAMPLE_TEMPERATURE, SAMPLE_TOP_P), text_of
    )
    top = max(want, key=want.get)
    p = want[top]
    band = SAMPLE_SIGMAS * float(np.sqrt(p * (1 - p) / n))
    plain = text_distribution(nucleus_distribution(logits, 1.0, SAMPLE_TOP_P), text_of)
    outside = sum(v for k, v in plain.items() if k not in want)
    tells_t = abs(plain.get(top, 0.0) - p) > 2 * band or outside > 0.2
    if not (tells_t and 1.0 - p > 2 * band):
        return None
    return {
        "nucleus": sorted(want),
        "top_text": top,
        "top_probability": p,
        "band": band,
        "top_probability_at_1": plain.get(top, 0.0),
    }


def sampling_case(logits: np.ndarray, text_of: list[str]) -> dict[str, Any]:
    """What check 3.10 expects of ``generate(temperature=0.6, top_p=0.9)`` on the
    reference's logits (see :func:`sampling_band`); regen refuses a probe that cannot
    tell a sampler that ignores the temperature, or is always greedy."""
    band = sampling_band(logits, text_of)
    assert band is not None, "probe cannot tell T or a greedy sampler"
    return {
        "prompt": SAMPLE_PROMPT,
        "temperature": SAMPLE_TEMPERATURE,
        "top_p": SAMPLE_TOP_P,
        "rows": SAMPLE_ROWS,
        "calls": SAMPLE_CALLS,
        **band,
    }


# ------------------------------------------------------------------- prompts


def benchmark_prompt(tokenizer: Any, n_tokens: int) -> str:
    """A text whose encoding (BOS included) is exactly ``n_tokens`` long."""
    words = ["Once", "upon", "a", "time", "in", "a", "galaxy", "far", "away"]
    text = ""
    i = 0
    while len(tokenizer.encode(text, bos=True, eos=False)) < n_tokens:
        text += words[i % len(words)] + " "
        i += 1
    while len(tokenizer.encode(text, bos=True, eos=False)) > n_tokens:
        text = text[:-1]
    assert len(tokenizer.encode(text, bos=True, eos=False)) == n_tokens
    return text


def words_prompt(tokenizer: Any, words: list[str], n_tokens: int, rng: np.random.Generator) -> str:
    """A seeded text of ``words`` whose encoding (BOS included) is exactly ``n_tokens`` long."""
    while True:
        text = "".join(rng.choice(words, n_tokens - 1))
        if len(tokenizer.encode(text, bos=True, eos=False)) == n_tokens:
            return text
