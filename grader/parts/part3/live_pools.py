"""Check 3.11's prompts for a profile whose benchmark model has sizes of its own (a GPU
workload), built at grading time by the reference solution on the grading device.

As for Parts 2 and 4: before the submission's worker first starts, the reference (run by
the same check machinery, through :meth:`GradingContext.reference_session`) builds the
workload's model, draws prompts of exactly ``input_len`` tokens from an unpredictable
seed, keeps those whose greedy continuation wins by at least ``POOL_MIN_GAP`` at every
step, and records its text. The reference's copy then leaves the sandbox.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from grader.parts.part3.cases import N_RANKS, POOL_MIN_GAP, pool_size, row_gaps

MAX_DRAWS = 4  # prompts drawn per prompt kept, at most, before the build gives up


def live_pool(probe: Any, bench: dict[str, Any]) -> dict[str, Any]:
    """The pool of check 3.11's timed runs under profile ``bench``, in the stored pools'
    format; ``probe`` is a Part 3 check instance, whose machinery drives the reference's
    worker for the time of a reference session."""
    with probe.ctx.reference_session("part3", linger=True):  # the yardstick's next
        return draw_pool(probe, bench)


def draw_pool(probe: Any, bench: dict[str, Any]) -> dict[str, Any]:
    """:func:`live_pool`'s work, once the reference answers the part's requests."""
    size, rows = pool_size(bench), max(bench["batch_sizes"])
    input_len, output_len = bench["input_len"], bench["output_len"]
    timeout = max(probe.ctx.limits.request_timeout_s, 120.0)
    seeds = np.random.default_rng(secrets.randbits(64))  # new prompts in every grading
    prompts: list[str] = []
    texts: list[str] = []
    for _ in range(MAX_DRAWS * size // rows + 1):
        if len(prompts) >= size:
            break
        header = {"op": "plain_prompts", "tokenizer": "public", "count": rows, "n_ranks": N_RANKS,
                  "input_len": input_len, "seed": int(seeds.integers(2**31))}  # fmt: skip
        probe.ensure("public", True, full=True)
        drawn = probe.ctx.worker("part3").request(header, what="prompts", timeout=timeout)
        batch = drawn.header["prompts"]
        out = probe.generate(
            batch, True, model="workload", max_gen_len=output_len, temperature=0.0,
            record_logits=True, timeout=timeout,
        )  # fmt: skip
        gaps = row_gaps(out.arrays["step_logits"])  # (B,)
        for text, generated, gap in zip(batch, probe.texts(out), gaps, strict=True):
            if gap >= POOL_MIN_GAP and len(prompts) < size:
                prompts.append(text)
                texts.append(generated)
    if len(prompts) < size:
        raise RuntimeError(
            f"the reference's model found {len(prompts)} of {size} prompts whose greedy "
            f"answer wins by {POOL_MIN_GAP:g} at every step"
        )
    return {"prompts": prompts, "expected_texts": texts}
