"""Part 3's hidden prompt pools for the timed runs (``regen`` only): a fresh prompt for
every row of every timed run of one grading, with the reference's greedy text."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from grader.parts.part3 import adapter, adapter_load
from grader.parts.part3.cases import (
    BENCH_MAX_BATCH,
    BENCH_MAX_SEQ_LEN,
    GROWTH_BATCH,
    GROWTH_LONG,
    GROWTH_PROMPT,
    GROWTH_ROUNDS,
    GROWTH_SHORT,
    N_RANKS,
    POOL_MIN_GAP,
    POOL_SEED,
    WORK_BATCH,
    WORK_NEW,
    WORK_PROMPT,
    WORK_ROUNDS,
    growth_key,
    pool_key,
    pool_size,
    row_gaps,
)


def bench_pools(reference: dict[str, ModuleType], run: dict[str, Any]) -> dict[str, Any]:
    """For every benchmark shape of the thresholds profiles, a fresh prompt for every row
    of every timed run of one grading, with the reference's greedy text for each (hidden:
    a submission can neither recognise a timed prompt nor look its answer up)."""
    from grader.core.thresholds import DEVICES, load_thresholds

    wanted: dict[tuple[int, int], int] = {}
    for device in DEVICES:
        bench = load_thresholds(device)["part3"]
        if "model" in bench:  # a model of the profile's own: its pool is built when grading
            continue
        shape = (bench["input_len"], bench["output_len"])
        wanted[shape] = max(wanted.get(shape, 0), pool_size(bench))
    run = {**run, "max_seq_len": BENCH_MAX_SEQ_LEN, "max_batch_size": BENCH_MAX_BATCH}
    model, tokenizer = adapter_load.build_from_checkpoint(reference, run)
    rng = np.random.default_rng(POOL_SEED)
    words = adapter.plain_words(tokenizer, N_RANKS)
    pools = {
        pool_key(*shape): bench_pool(model, tokenizer, words, *shape, size, rng)
        for shape, size in sorted(wanted.items())
    }
    size = 2 * WORK_ROUNDS * WORK_BATCH
    pools["work"] = bench_pool(model, tokenizer, words, WORK_PROMPT, WORK_NEW, size, rng)
    size = (1 + GROWTH_ROUNDS) * GROWTH_BATCH  # a first round, then GROWTH_ROUNDS more
    for new_tokens in (GROWTH_SHORT, GROWTH_LONG):  # every row runs all its steps
        pools[growth_key(new_tokens)] = bench_pool(
            model, tokenizer, words, GROWTH_PROMPT, new_tokens, size, rng, run_full=True
        )
    return pools


def bench_pool(
    model: Any,
    tokenizer: Any,
    words: list[str],
    input_len: int,
    output_len: int,
    size: int,
    rng: np.random.Generator,
    run_full: bool = False,
) -> dict[str, Any]:
    """``size`` random prompts of ``input_len`` tokens (BOS included) whose greedy
    continuation wins by at least ``POOL_MIN_GAP`` at every step, with its text. With
    ``run_full``, only prompts whose continuation never reaches a stop token: a batch of
    them runs all ``output_len`` steps (what check 3.7's growth probe divides by)."""
    run = {"max_gen_len": output_len, "temperature": 0.0, "top_p": 0.9, "seed": 0}
    run.update(kv_caching=True, record_logits=True)
    prompts: list[str] = []
    texts: list[str] = []
    while len(prompts) < size:
        batch = []
        while len(batch) < BENCH_MAX_BATCH:
            text = "".join(rng.choice(words, input_len - 1))
            if len(tokenizer.encode(text, bos=True, eos=False)) == input_len:
                batch.append(text)
        out = adapter.run_generate(model, tokenizer, batch, run)
        gaps = row_gaps(out["step_logits"])  # (B,)
        greedy = out["step_logits"].argmax(axis=-1)  # (steps, B): every step's new token
        stops = np.isin(greedy, sorted(tokenizer.stop_tokens)).any(axis=0)  # (B,)
        for text, generated, gap, stop in zip(batch, out["texts"], gaps, stops, strict=True):
            if gap >= POOL_MIN_GAP and not (run_full and stop) and len(prompts) < size:
                prompts.append(text)
                texts.append(generated)
    return {"prompts": prompts, "expected_texts": texts}
