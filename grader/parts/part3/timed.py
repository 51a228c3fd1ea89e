"""Part 3's measured runs: prompts nobody has seen, answers checked, work counted by the grader.

Every row of every timed ``generate`` (check 3.11's rounds, check 3.7's work and
growth probes) gets a prompt of its own from a hidden pool built at ``regen`` time, and
its greedy text must be the reference's (the pool's prompts are chosen so that
the top token wins every step clearly). So a timed run cannot be recognised,
answered from a memo of an earlier request or another row, or answered with
dummy text. What a run costs is read by the parent: wall time, and the CPU
time the kernel charged the worker. Without the hidden cases (a student's own
copy) every row gets the public benchmark prompt and only the rows' agreement
is checked.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from grader.core.feedback import HIDDEN_ANSWER
from grader.core.thresholds import load_thresholds
from grader.judging.base import Workload
from grader.judging.cache_read import cache_read_outcome
from grader.judging.calls import fed_once, shown
from grader.judging.timed_pools import TimedPools
from grader.parts.part3.cases import (
    BENCH_MAX_SEQ_LEN,
    GROWTH_BATCH,
    GROWTH_LONG,
    GROWTH_PROMPT,
    GROWTH_ROUNDS,
    GROWTH_SHORT,
    MAX_CACHED_GROWTH,
    MIN_WORK_RATIO,
    WORK_BATCH,
    WORK_NEW,
    WORK_PROMPT,
    WORK_ROUNDS,
    growth_key,
    pool_key,
)
from grader.parts.part3.support import Part3Base
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import Ratio, Sample, Timing, round_length

# A cache that attention reads changes the logits by O(1) when scrambled; float noise
# alone stays below 1e-3.
CACHE_READ_MIN_EFFECT = 1e-3
# The cache-read probe's single-token steps after the scramble, the last one judged: a
# cache refreshed from the tokens at any period up to 64 steps is clean again by then.
CACHE_READ_STEPS = 65


class Part3Timed(TimedPools, Part3Base):
    """Timed greedy ``generate`` runs on fresh prompts, checked against the reference."""

    min_work_ratio = MIN_WORK_RATIO
    work_shape = (WORK_NEW, WORK_BATCH, WORK_PROMPT)
    last_calls: Any = None  # the model calls (start_pos, tokens) of the last timed run
    growth_calls: list[Any]  # the model calls of every run of the growth probe
    max_cached_growth = MAX_CACHED_GROWTH
    growth_shape = (GROWTH_BATCH, GROWTH_PROMPT, GROWTH_SHORT, GROWTH_LONG)
    growth_label = "kv_caching=True"

    def take(self, key: str, rows: int, input_len: int) -> tuple[list[str], list[str] | None]:
        """The next ``rows`` unused prompts of pool ``key`` and the reference's text for
        each; without the pool, a public benchmark prompt in every row and None."""
        pool, picked = self.reserve(key, rows)
        if pool is None:  # the public benchmark prompt of this length, or the shortest
            public = self.meta()["benchmark_prompts"]
            prompt = public.get(str(input_len)) or min(public.values(), key=len)
            return [prompt] * rows, None
        return pool["prompts"][picked], pool["expected_texts"][picked]

    def timed_generate(
        self,
        model: str,
        pool_name: str,
        shape: tuple[int, int, int],
        cache: bool,
        checked: bool = True,
        **kw: Any,
    ) -> Sample:
        """One timed greedy ``generate`` of ``shape`` (rows, prompt tokens, new tokens) on
        fresh prompts of pool ``pool_name``; its text must be the reference's in every row, or
        the check fails (a run whose answer is wrong cannot count). ``checked`` False: a
        warm-up's, whose time never counts."""
        rows, input_len, output_len = shape
        prompts, expected = self.take(pool_name, rows, input_len)
        reply = self.generate_or_fail(
            prompts,
            cache,
            model=model,
            max_gen_len=output_len,
            temperature=0.0,
            record_logits=False,
            timed=True,
            **kw,
        )
        self.last_calls = reply.header.get("calls")
        texts = self.texts(reply)
        want = expected if expected is not None else (texts[:1] * rows or [""])
        if checked and texts != want:
            wrong = [i + 1 for i, (a, b) in enumerate(zip(texts, want, strict=False)) if a != b]
            if expected is not None:
                self.note_detail(HIDDEN_ANSWER, True)
            self.fail(
                f"A timed greedy generate(kv_caching={cache}) of {rows} prompt(s) of "
                f"{input_len} tokens, {output_len} new tokens, returned other text than the "
                f"reference in row(s) {wrong or 'all'}: its time cannot count. Every row of "
                "every timed run has a prompt of its own; the answer must be computed for "
                f"it. Got: {str(texts)[:300]}\n"
                + self.generation_cause(reply, want, BENCH_MAX_SEQ_LEN)
            )
        return reply.sample()

    def work_probe(self) -> tuple[Ratio, dict[str, Timing]]:
        """CPU time of cached against cache-free greedy ``generate`` (``WORK_NEW`` tokens
        after ``WORK_BATCH`` prompts of ``WORK_PROMPT`` tokens, on the CPU, interleaved
        ``WORK_ROUNDS`` times), every run's text checked against the reference's.
        Measured by the grader: a "cache" that recomputes the prefix cannot do much
        less work than no cache."""
        return self.interleaved_work(WORK_ROUNDS, self.work_run, threshold=self.min_work_ratio)

    def work_run(self, cache: bool, i: int) -> Sample:
        """One timed greedy run of the work probe, with or without the cache."""
        shape = (WORK_BATCH, WORK_PROMPT, WORK_NEW)
        return self.timed_generate("work", "work", shape, cache, key="work generate")

    def bench_run(
        self, bench: dict, variants: dict[str, tuple[int, bool]], variant: str, i: int
    ) -> Sample:
        """One timed generate of ``variant`` (its batch size and kv_caching): every row of
        every run has a prompt of its own and the reference's text. A warm-up round's is
        shorter (:func:`round_length`), its text unchecked (the pool holds the whole run's)."""
        batch, cache = variants[variant]
        warm = i < bench["warmup"]
        sample = self.timed_generate(
            "workload" if "model" in bench else "bench",  # a GPU workload's model, or the tiny
            bench_key(bench),
            (batch, bench["input_len"], round_length(bench["output_len"], bench, i)),
            cache,
            timeout=max(self.ctx.limits.request_timeout_s, 60.0),
            key=f"timed generate {batch} {cache}",
            checked=not warm,
        )
        return sample

    def cache_read_problem(self) -> str:
        """Whether the cached path's attention reads what its cache holds: after a prefill of
        a public case, noise over every tensor the model holds that may be its cache must
        change the next step's logits. The worker looks for the cache after the prefill,
        wherever an honest design keeps it (Meta's ``cache_k`` / ``cache_v`` allocated up
        front or on first use, grown with torch.cat or copied at every step, or per-layer
        (keys, values) tensors that the model hands to its layers), so the cache is the one
        the next step finds. An attention that projects every position again from kept layer
        inputs (right logits, right cache shapes and memory) reads nothing from it. The
        figure comes from the submission's process: it names an honest design, and the
        yardstick stops a forger. "" when the cache is read or the probe cannot run."""
        case = next((c for c in self.cases("3.2") if c["model"] == "public"), None)
        if case is None:
            return ""
        prompt = np.array(case["tokens"], dtype=np.int64)[:1]
        prefix = prompt.shape[1] - 1
        # The case's tokens again and again after its prompt: any ids serve the steps.
        tokens = np.resize(prompt, (1, prefix + CACHE_READ_STEPS))
        params = self.meta()["models"]["public"]["params"]
        header = {
            "op": "cache_read",
            "model": "public",
            "kv_caching": True,
            "prefix": prefix,
            "steps": CACHE_READ_STEPS,
            "heads": [params["n_kv_heads"], params["n_heads"]],
            "head_dim": params["dim"] // params["n_heads"],
        }
        try:
            self.ensure("public", True)
            reply = self.call(header, {"tokens": tokens}, "scrambling the cache after a prefill")
        except SubmissionError:
            return ""  # the checks of forward name why it cannot run
        effect, layers = reply.header.get("effect"), reply.header.get("layer_effects")
        return cache_read_verdict(effect, prefix) or layer_read_verdict(layers, prefix)

    def yardstick_workloads(self) -> dict[str, Workload]:
        """The reference's cached runs of the work probe (3.7) and of check 3.11."""
        bench = load_thresholds(self.ctx.device)["part3"]
        cached = {f"batch {b}, with the cache": (b, True) for b in bench["batch_sizes"]}
        run = functools.partial(self.bench_run, bench, cached)
        return {**self.work_workload(), "bench": (run, list(cached), bench)}

    def work_advice(self, ratio: Ratio, cpu: dict[str, float]) -> str:
        """Why this part's cached path failed the work probe, for the student."""
        return (
            f"generate(kv_caching=True) did not do much less work than "
            f"generate(kv_caching=False): {WORK_NEW} new tokens after {WORK_BATCH} prompts "
            f"of {WORK_PROMPT} tokens took {cpu['with the cache']:.0f} ms of CPU time with "
            f"the cache and {cpu['without the cache']:.0f} ms without it "
            f"({ratio.median:.2f}x; a working cache needs at least {MIN_WORK_RATIO:g}x here). "
            "With the cache, each decode step must feed only the newest token per sequence "
            "at start_pos = prev_pos and attend over the cached keys and values."
        )

    def growth_probe(self) -> Ratio:
        """CPU seconds per new token of cached greedy ``generate`` alone, ``GROWTH_LONG``
        new tokens over ``GROWTH_SHORT``, after ``GROWTH_BATCH`` prompts of
        ``GROWTH_PROMPT`` tokens on the work model (CPU), every run on prompts of its own
        with its text checked against the reference's. A cache keeps every step's cost
        nearly flat; recomputing the prefix makes the long run's steps dearer. The
        submission's cache-free path plays no part in it, so slowing that path on purpose
        cannot move it. One round first; only when it is near the line are
        ``GROWTH_ROUNDS`` more rounds measured, and they alone decide."""

        self.growth_calls = []

        def run(new_tokens: int, _: int) -> Sample:
            shape = (GROWTH_BATCH, GROWTH_PROMPT, new_tokens)  # (rows, prompt, new tokens)
            key, timeout = f"growth generate {new_tokens}", self.ctx.limits.request_timeout_s
            sample = self.timed_generate(
                "work", growth_key(new_tokens), shape, True, key=key, timeout=max(timeout, 60.0)
            )
            self.growth_calls.append(self.last_calls)
            return sample

        return self.cached_growth(
            GROWTH_ROUNDS, run, GROWTH_SHORT, GROWTH_LONG, threshold=self.max_cached_growth
        )

    def growth_calls_problem(self) -> str:
        """Why a growth run's model calls were not the prompt once and then one token per
        call at the next position ("" when none was; :func:`calls_problem`)."""
        return calls_problem(self.growth_calls)

    def growth_advice(self, growth: Ratio) -> str:
        """Why this part's cached path failed the growth probe, for the student."""
        return (
            "generate(kv_caching=True) did not keep the cost of a decode step flat: after "
            f"{GROWTH_BATCH} prompts of {GROWTH_PROMPT} tokens, each new token cost "
            f"{growth.median:.2f}x more CPU time when generating {GROWTH_LONG} tokens than "
            f"when generating {GROWTH_SHORT} (a working cache stays within "
            f"{MAX_CACHED_GROWTH:g}x: each step feeds one new token per sequence at "
            "start_pos = prev_pos and attends over the cached keys and values). Your cached "
            "path recomputes the sequence so far at every step, whatever "
            "generate(kv_caching=False) costs."
        )


def bench_key(bench: dict[str, Any]) -> str:
    """The pool of check 3.11's timed runs under the thresholds profile ``bench``."""
    return pool_key(bench["input_len"], bench["output_len"], bench.get("model"))


def layer_read_verdict(effects: Any, prefix: int) -> str:
    """Why the cache-read probe's per-module figures (``effects``: module name -> the
    largest change of the logits with that module's cache tensors alone scrambled) show a
    module whose cache is not read, while the others' are ("" when each is read, or with
    fewer than two modules holding a cache: the figure of all at once judged them)."""
    if not isinstance(effects, dict) or len(effects) < 2:
        return ""
    unread = [
        str(name)[:80] or "the model itself"
        for name, effect in sorted(effects.items())
        if cache_read_outcome(effect, CACHE_READ_MIN_EFFECT) == "ignores"
    ]
    if not unread:
        return ""
    return (
        f"the cache held by {', '.join(unread)} is not read: noise written over it alone, "
        f"right after a prefill of {prefix} tokens, left the logits unchanged "
        f"{CACHE_READ_STEPS} single-token steps later, while the other layers' caches do "
        "change them. That attention computes its keys or values again instead of reading "
        "the ones it stored."
    )


def cache_read_verdict(effect: Any, prefix: int) -> str:
    """Why the cache-read probe's ``effect`` (the largest change of the next step's logits
    with the cache scrambled after a prefill of ``prefix`` tokens) shows an attention that
    does not read its cache ("" when it reads it). No figure (None: no tensor that may be a
    cache was found, so the growth and work probes judge alone) names nothing; NaN never
    passes."""
    outcome = cache_read_outcome(effect, CACHE_READ_MIN_EFFECT)
    if outcome in (None, "reads"):
        return ""
    if outcome == "nan":
        return (
            f"after a prefill of {prefix} tokens, the next step's logits were NaN, so whether "
            "attention reads its cache could not be seen."
        )
    return (
        f"attention does not read its cache: noise written, right after a prefill of {prefix} "
        "tokens, over every tensor that may hold the cache (cache_k / cache_v, or tensors "
        "shaped like keys or values of every position) left the logits unchanged "
        f"{CACHE_READ_STEPS} single-token steps later (largest change {effect:.2g}). With "
        "kv_caching, keys and values of earlier positions must come from the cache at every "
        "step, not be computed again, at once or every few steps."
    )


def calls_problem(runs: list[Any]) -> str:
    """Why a timed cached ``generate``'s model calls were not the prompt once (in one call
    or in chunks) and then one token per call, each at the position after the last ("" when
    they were; see :mod:`grader.judging.calls`)."""
    for calls in runs:
        if not isinstance(calls, list) or not all(
            isinstance(c, list) and len(c) == 2 for c in calls
        ):
            continue
        starts, lengths = [int(c[0]) for c in calls], [int(c[1]) for c in calls]
        prompt = next((i for i, n in enumerate(lengths) if n == 1), len(lengths))
        consecutive = all(s == sum(lengths[:i]) for i, s in enumerate(starts))
        if not (consecutive and fed_once(lengths, sum(lengths[:prompt]))):
            pairs = [f"({s}, {n})" for s, n in zip(starts, lengths, strict=True)]
            return (
                f"a timed generate(kv_caching=True) called the model at (start_pos, tokens) "
                f"{shown(pairs)}. With the cache the prompt goes through the model once, then "
                "each new token alone at the next position; feeding more (prev_pos set back "
                "every few steps, or the last few tokens again) recomputes part of the work."
            )
    return ""
