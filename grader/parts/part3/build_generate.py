"""Part 3's generation cases (``regen`` only): check 3.5's full and stop batches, check
3.9's hidden stop batch and check 3.10's temperature probe, each from one reference
:class:`~grader.parts.part3.build.Observer` (so from one RoPE convention); and what the
cache-contents probe sees of a package (the mistakes' signatures)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from grader.parts.part3 import adapter
from grader.parts.part3.cache_contents import CONTENTS_PREFIX, observation
from grader.parts.part3.cases import (
    ATOL,
    FULL_SEED,
    GENERATE,
    MAX_SEQ_LEN,
    MODELS,
    N_RANKS,
    POOL_MIN_GAP,
    SAMPLE_PROMPT,
    STOP_NEW,
    STOP_PROMPT,
    STOP_SEED,
    sampling_case,
    words_prompt,
)

#: ``ref`` below: a ``build.Observer`` (typed loosely: ``build`` imports this module).
Observer = Any
#: Check 3.5's full batch: one prompt per cache row, the longest filling every position.
FULL_LENGTHS = (MAX_SEQ_LEN, MAX_SEQ_LEN - 8, MAX_SEQ_LEN - 24, MAX_SEQ_LEN - 40)
#: The hidden stop batch's prompts (check 3.9).
HIDDEN_STOP_SEED = 6565


def sampling_probe(ref: Observer) -> dict[str, Any]:
    """Check 3.10's temperature probe, from the reference's logits for its prompt."""
    tok = ref.tokenizer
    ids = np.array([tok.encode(SAMPLE_PROMPT, bos=True, eos=False)], dtype=np.int64)
    logits = ref.forward("public", ids, "no_cache")[0, -1]  # (vocab,)
    return sampling_case(logits, token_texts(ref, logits.shape[0]))


def token_texts(ref: Observer, vocab: int) -> list[str]:
    """The text ``generate`` returns for each token id drawn as its only new token ("" for
    a stop token, where the text ends): check 3.10 reads the texts a submission drew as
    tokens of its own logits' distribution."""
    tok = ref.tokenizer
    return ["" if i in tok.stop_tokens else tok.decode([i]) for i in range(vocab)]


def full_batch(ref: Observer) -> dict[str, Any]:
    """Check 3.5's full batch: ``max_batch_size`` seeded prompts of ``FULL_LENGTHS`` tokens,
    the longest exactly ``max_seq_len`` (Meta's guard refuses only longer ones), so the
    loop runs to the last cache slot; every greedy step of a generating row wins clearly."""
    rng = np.random.default_rng(FULL_SEED)
    words = adapter.plain_words(ref.tokenizer, N_RANKS)
    for _ in range(50):
        prompts = [words_prompt(ref.tokenizer, words, n, rng) for n in FULL_LENGTHS]
        runs = {cache: ref.generate("public", prompts, cache) for cache in (True, False)}
        top2 = np.sort(runs[True]["step_logits"], axis=-1)[..., -2:]  # (steps, B, 2)
        cur_pos = min(FULL_LENGTHS) + np.arange(top2.shape[0])[:, None]  # (steps, 1)
        generating = cur_pos >= np.array(FULL_LENGTHS)[None, :]
        gaps = (top2[..., 1] - top2[..., 0])[generating]
        if runs[True]["texts"] == runs[False]["texts"] and gaps.min() >= POOL_MIN_GAP:
            return {
                "prompts": prompts,
                "prompt_tokens": list(FULL_LENGTHS),
                "max_gen_len": GENERATE["max_gen_len"],
                "expected_texts": runs[True]["texts"],
            }
    raise RuntimeError("no full batch whose greedy steps all win clearly")


def stop_batch(ref: Observer, model: str = "public", seed: int = STOP_SEED) -> dict[str, Any]:
    """Check 3.5's (public) and 3.9's (hidden) stop batch: two seeded prompts, the first
    one's greedy continuation reaching ``<|eot_id|>`` before any other stop token (the
    text must end there: Llama 3 stops at every token of ``stop_tokens``, not only at
    ``<|end_of_text|>``), the second one no stop token; every greedy step up to a row's
    stop wins clearly."""
    rng = np.random.default_rng(seed)
    words = adapter.plain_words(ref.tokenizer, N_RANKS)
    stops = set(ref.tokenizer.stop_tokens)
    eot = ref.tokenizer.special_tokens["<|eot_id|>"]
    for _ in range(2000):
        prompts = [words_prompt(ref.tokenizer, words, STOP_PROMPT, rng) for _ in range(2)]
        run = ref.generate(model, prompts, True, max_gen_len=STOP_NEW)
        logits = run["step_logits"]  # (steps, B, vocab)
        chosen = logits.argmax(axis=-1)  # (steps, B)
        hits = [np.flatnonzero(np.isin(chosen[:, b], list(stops))) for b in range(2)]
        if not (len(hits[0]) and hits[0][0] < len(chosen) - 1 and not len(hits[1])):
            continue
        if chosen[hits[0][0], 0] != eot:
            continue
        top2 = np.sort(logits, axis=-1)[..., -2:]  # (steps, B, 2)
        gaps = top2[..., 1] - top2[..., 0]  # (steps, B)
        if gaps[: hits[0][0] + 1, 0].min() < POOL_MIN_GAP or gaps[:, 1].min() < POOL_MIN_GAP:
            continue
        plain = ref.generate(model, prompts, False, max_gen_len=STOP_NEW)
        if plain["texts"] == run["texts"]:
            return {
                "prompts": prompts,
                "prompt_tokens": [STOP_PROMPT, STOP_PROMPT],
                "max_gen_len": STOP_NEW,
                "expected_texts": run["texts"],
            }
    raise RuntimeError(f"no seeded prompt whose greedy continuation reaches <|eot_id|> ({model})")


def cache_observation(
    obs: Observer, tokens: np.ndarray, expected: dict[str, Any]
) -> dict[str, Any]:
    """What the cache-contents probe sees of ``obs``'s cached public model, through the
    worker's own search (its modules importable by their flat names, as in the sandbox)."""
    spec = MODELS["public"][0]
    heads, head_dim = (spec["n_kv_heads"], spec["n_heads"]), spec["dim"] // spec["n_heads"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "worker"))
    try:
        model = obs.models["public", True]
        _, arrays = adapter.cache_contents(model, tokens, CONTENTS_PREFIX, heads, head_dim)
    finally:
        sys.path.pop(0)
    return observation(expected, arrays, ATOL)
