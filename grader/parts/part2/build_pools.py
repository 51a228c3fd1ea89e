"""Part 2's hidden prompt pools for the timed runs (``regen`` only): fresh prompts for
every timed ``generate`` of one grading, with the reference's greedy new tokens."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from grader.parts.part2 import adapter
from grader.parts.part2.cases import (
    GROWTH_BATCH,
    GROWTH_LONG,
    GROWTH_PROMPT,
    GROWTH_ROUNDS,
    POOL_SEED,
    POOL_TEMPERATURE,
    PUBLIC_MODEL,
    WORK_BATCH,
    WORK_NEW,
    WORK_POSITIONS,
    WORK_PROMPT,
    WORK_ROUNDS,
    bench_model,
    clear_win,
    make_state_dict,
    pool_key,
    pool_size,
    random_ids,
)


def bench_pools(reference_module: ModuleType) -> dict[str, Any]:
    """For every benchmark shape of the thresholds profiles, fresh prompts for every timed
    run of one grading and the reference's tokens for each (hidden, so a submission can
    neither recognise a timed prompt nor look its answer up); then the work probe's pool
    and the growth probe's (check 2.9), both on the work model."""
    from grader.core.thresholds import DEVICES, load_thresholds

    wanted: dict[tuple[int, int], int] = {}
    for device in DEVICES:
        bench = load_thresholds(device)["part2"]
        if "model" in bench:  # a model of the profile's own: its pool is built when grading
            continue
        shape = (bench["prompt_len"], bench["new_tokens"])
        wanted[shape] = max(wanted.get(shape, 0), pool_size(bench))
    rng = np.random.default_rng(POOL_SEED)
    pools = {
        pool_key(*shape): bench_pool(reference_module, *shape, size, rng)
        for shape, size in sorted(wanted.items())
    }
    size = 2 * WORK_ROUNDS * WORK_BATCH
    pools["work"] = bench_pool(
        reference_module, WORK_PROMPT, WORK_NEW, size, rng, positions=WORK_POSITIONS
    )
    # Drawn after the others, so their prompts stay what they were. Every growth run, short
    # or long, takes prompts of its own; a short run checks the first of the new tokens.
    size = 2 * GROWTH_ROUNDS * GROWTH_BATCH
    pools["growth"] = bench_pool(
        reference_module, GROWTH_PROMPT, GROWTH_LONG, size, rng, positions=WORK_POSITIONS
    )
    return pools


def bench_pool(
    reference_module: ModuleType,
    prompt_len: int,
    new_tokens: int,
    size: int,
    rng: np.random.Generator,
    positions: int | None = None,
) -> dict[str, Any]:
    """``size`` random prompts on the benchmark's model (``positions`` positions, or just
    room for the run) whose greedy continuation wins by at least ``POOL_MIN_GAP`` at every
    step, with the reference's new tokens."""
    spec = bench_model(PUBLIC_MODEL, positions or prompt_len + new_tokens)
    model = adapter.build_model(reference_module, spec["config"], make_state_dict(spec))
    vocab = spec["config"]["vocab_size"]
    prompts, expected = [], []
    while len(prompts) < size:
        ids = random_ids(rng, vocab, 1, prompt_len)
        out = adapter.run_generate(model, ids, new_tokens, POOL_TEMPERATURE, True, 0)["tokens"]
        logits = adapter.run_forward(model, out[:, :-1], None)["logits"][:, prompt_len - 1 :]
        if not clear_win(logits, out[:, prompt_len:]):
            continue
        prompts.append(ids[0].tolist())
        expected.append(out[0, prompt_len:].tolist())
    return {
        "temperature": POOL_TEMPERATURE,
        "prompts": prompts,
        "expected": expected,
    }
