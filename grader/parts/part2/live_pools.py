"""Check 2.11's prompt pool for a profile whose benchmark model has sizes of its own (a GPU
workload), built at grading time by the reference solution on the grading device.

Such a model is far too large for ``regen`` to run on a TA's CPU, and its answers must be
the grading device's anyway. So before the submission's worker first starts, a worker
running the reference (trusted code, same sandbox, same limits) draws fresh prompts from
an unpredictable seed, keeps those whose greedy continuation wins by at least
``POOL_MIN_GAP`` at every step, and records its new tokens. The submission's timed runs
must then return those tokens, exactly as with a stored pool. The reference's copy leaves
the sandbox before the submission's worker starts.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from grader.parts.part2.cases import (
    POOL_MIN_GAP,
    POOL_TEMPERATURE,
    bench_model,
    clear_win,
    load_header,
    make_state_dict,
    pool_size,
    random_ids,
)
from grader.runtime.context import GradingContext

CANDIDATES = 4  # prompts the reference continues per request
MAX_DRAWS = 8  # candidates drawn per prompt kept, at most, before the build gives up


def live_pool(ctx: GradingContext, public: dict[str, Any], bench: dict[str, Any]) -> dict:
    """The pool of check 2.11's timed runs for profile ``bench`` (which names a model of
    its own), in the stored pools' format."""
    prompt_len, new_tokens = bench["prompt_len"], bench["new_tokens"]
    spec = bench_model(public, prompt_len + new_tokens, bench["model"])
    size, vocab = pool_size(bench), spec["config"]["vocab_size"]
    timeout = max(ctx.limits.request_timeout_s, 120.0)
    prompts: list[list[int]] = []
    expected: list[list[int]] = []
    with ctx.reference_session("part2", linger=True) as worker:  # the yardstick's next
        weights = {}
        if not spec.get("on_device"):
            weights = ctx.seeded_weights("part2", spec, lambda: make_state_dict(spec))
        worker.request(load_header("bench", spec), weights, what="the reference's model",
                       timeout=timeout)  # fmt: skip
        ctx.built("part2")["bench"] = worker.starts  # as check 2.11 loads it
        rng = np.random.default_rng(secrets.randbits(64))  # new prompts in every grading
        for _ in range(MAX_DRAWS * size // CANDIDATES + 1):
            if len(prompts) >= size:
                break
            ids = random_ids(rng, vocab, CANDIDATES, prompt_len)
            generate = {"op": "generate", "model": "bench", "max_new_tokens": new_tokens,
                        "temperature": POOL_TEMPERATURE, "use_cache": True, "seed": 0}  # fmt: skip
            out = worker.request(generate, {"input_ids": ids}, what="generate", timeout=timeout)
            tokens = out.arrays["tokens"]  # (B, T + n)
            forward = {"op": "forward", "model": "bench", "steps": None}
            reply = worker.request(
                forward, {"input_ids": tokens[:, :-1]}, what="forward", timeout=timeout
            )
            logits = reply.arrays["logits"][:, prompt_len - 1 :]  # (B, n, vocab)
            for row in range(CANDIDATES):
                if clear_win(logits[row : row + 1], tokens[row : row + 1, prompt_len:]):
                    prompts.append(ids[row].tolist())
                    expected.append(tokens[row, prompt_len:].tolist())
    if len(prompts) < size:
        raise RuntimeError(
            f"the reference's model found {len(prompts)} of {size} prompts whose greedy "
            f"answer wins by {POOL_MIN_GAP:g} at every step"
        )
    return {"temperature": POOL_TEMPERATURE, "prompts": prompts[:size], "expected": expected[:size]}
