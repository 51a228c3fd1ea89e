"""Check 4.6's prompts for a profile whose benchmark model has sizes of its own (a GPU
workload), built at grading time by the reference solution on the grading device.

As for Part 2 (``grader/parts/part2/live_pools.py``): before the submission's worker first
starts, a worker running the reference draws prompts from an unpredictable seed, keeps
those whose greedy steps all win by ``MARGIN``, and records its tokens up to the longest
L; the submission's timed runs must return them. The reference's copy then leaves the
sandbox.

The candidates are continued a batch at a time (one request of ``size`` rows): on a GPU
a step of GPT-2 costs about as much for 28 rows as for one, where one prompt at a time
cost the H200 about 114 s. A row's logits in a batch differ from its logits alone by
rounding (about 1e-5 of a unit-spread logit, measured on the CPU), far inside ``MARGIN``.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from grader.parts.part4.pools import MARGIN, PROMPT_LEN, runs_per_grading
from grader.runtime.context import GradingContext

MAX_DRAWS = 4  # prompts drawn per prompt kept, at most, before the build gives up
KEY = "4.6"  # the pool's key among Part 4's pools built in the grading


def live_pool(ctx: GradingContext, spec: dict[str, Any], bench: dict[str, Any]) -> list[dict]:
    """Prompts for every timed run of check 4.6 under profile ``bench``, on model ``spec``,
    in the stored cases' format (``ids``, ``tokens``, ``label``)."""
    size, longest = runs_per_grading(bench), max(bench["L_values"])
    vocab = spec["config"]["vocab_size"]
    timeout = max(ctx.limits.request_timeout_s, 120.0)
    cases: list[dict[str, Any]] = []
    with ctx.reference_session("part4", linger=True) as worker:  # the yardstick's next
        header = {"op": "build", "model": "bench", **spec}
        worker.request(header, what="the reference's GPT-2", timeout=timeout)
        ctx.built("part4")["bench"] = worker.starts  # as check 4.6 builds it
        rng = np.random.default_rng(secrets.randbits(64))  # new prompts in every grading
        for _ in range(MAX_DRAWS):
            if len(cases) >= size:
                break
            ids = rng.integers(0, vocab, size=(size, PROMPT_LEN), dtype=np.int64)
            request = {"op": "generate", "model": "bench", "n": longest, "cached": True,
                       "gaps_only": True}  # fmt: skip
            reply = worker.request(request, {"ids": ids}, what="generate", timeout=timeout)
            gaps = reply.arrays["step_gaps"]  # (steps, B): each step's best minus runner-up
            tokens = reply.arrays["tokens"]  # (B, PROMPT_LEN + longest)
            if gaps.shape != (longest, size):
                continue
            for row in range(size):
                if len(cases) < size and float(gaps[:, row].min()) > MARGIN:
                    label = f"timed prompt {len(cases) + 1}, drawn for this grading"
                    one = slice(row, row + 1)
                    cases.append({"ids": ids[one].tolist(), "tokens": tokens[one].tolist(),
                                  "label": label})  # fmt: skip
    if len(cases) < size:
        raise RuntimeError(
            f"the reference's model found {len(cases)} of {size} prompts whose greedy steps "
            f"all win by {MARGIN:g}"
        )
    return cases
