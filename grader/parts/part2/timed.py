"""Part 2's measured runs: prompts nobody has seen, answers checked, work counted by the grader.

Every timed ``generate`` (check 2.11's rounds and check 2.9's work probe) gets
a prompt of its own from a hidden pool built at ``regen`` time, and its tokens
must be the reference's (the pool's prompts are chosen so that the model's top
token wins every step clearly; the runs sample at a temperature that makes
sampling greedy). So a timed run cannot be recognised, answered from a memo
of an earlier request, or answered with dummy tokens. What a run costs is read
by the parent: wall time, and the CPU time the kernel charged the worker.
Without the hidden cases (a student's own copy) the prompts are drawn here and
only the shape and range of the answer are checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.core.arrays import decode_array
from grader.core.feedback import HIDDEN_ANSWER
from grader.core.thresholds import load_thresholds
from grader.judging.base import Workload
from grader.judging.cache_read import cache_read_outcome
from grader.judging.calls import fed_once, shown
from grader.judging.timed_pools import WITH, TimedPools
from grader.parts.part2.cases import (
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
    pool_key,
)
from grader.parts.part2.support import Part2Base
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import Ratio, Sample, Timing, round_length

# A cache that attention reads changes the logits by O(1) when scrambled; float noise
# alone stays below 1e-3.
CACHE_READ_MIN_EFFECT = 1e-3
# The cache-read probe's single-token steps after the scramble, the last one judged: a
# cache refreshed from the tokens at any period up to 64 steps is clean again by then.
CACHE_READ_STEPS = 65
# Its prefill (two rows of seeded random ids): prefix and steps fit the public model's
# 128 positions, and the scrambled positions keep a fifth of the last step's attention.
CACHE_READ_PREFIX, CACHE_READ_ROWS, CACHE_READ_SEED = 16, 2, 31337


class Part2Timed(TimedPools, Part2Base):
    """Timed ``generate`` runs on fresh prompts, checked against the reference's tokens."""

    last_lengths: list[int] | None = None  # forward's input lengths in the last timed run

    min_work_ratio = MIN_WORK_RATIO
    work_shape = (WORK_NEW, WORK_BATCH, WORK_PROMPT)

    def take(
        self, key: str, rows: int, prompt_len: int, vocab: int, seed: int
    ) -> tuple[list[list[int]], list[list[int]] | None]:
        """The next ``rows`` unused prompts of pool ``key`` and the reference's new tokens
        for each; without the pool (the self-check), prompts drawn from ``seed`` and None:
        a round's cached and cache-free runs share their seed, so they share prompts too,
        and :meth:`same_as_cache_free` compares their answers."""
        pool, picked = self.reserve(key, rows)
        if pool is None:
            rng = np.random.default_rng([11, seed, rows, prompt_len, len(key)])
            return rng.integers(0, vocab, size=(rows, prompt_len)).tolist(), None
        return pool["prompts"][picked], pool["expected"][picked]

    def same_as_cache_free(
        self, key: str, seed: int, use_cache: bool | None, prompt_len: int, tokens: np.ndarray
    ) -> None:
        """Without the hidden answers, a timed run's new tokens against those of the same
        round's run in the other mode (same prompts, same seed): the cached path must give
        the cache-free path's tokens, as 2.8 asks, or its time cannot count. On Gradescope
        each run is compared with the reference's answer instead."""
        runs = self.ctx.scratch.setdefault("part2.selfcheck_answers", {})
        mine = runs.setdefault((key, seed, prompt_len), {})
        mine[use_cache is not False] = tokens[:, prompt_len:]
        if len(mine) < 2:
            return
        cached, plain = mine[True], mine[False]
        n = min(cached.shape[1], plain.shape[1])
        if cached.shape[0] == plain.shape[0] and not np.array_equal(cached[:, :n], plain[:, :n]):
            row, k = (int(x) for x in np.argwhere(cached[:, :n] != plain[:, :n])[0])
            self.fail(
                "A timed generate with the cache returned other tokens than the same round's "
                "generate(use_cache=False) on the same prompts and seed (first difference: "
                f"row {row + 1} of {len(cached)}, new token {k + 1}): the cached answer is "
                "wrong, so its time cannot count (compare checks 2.4 and 2.5). Gradescope "
                "compares every timed run with the reference's answer on hidden prompts."
            )

    def timed_generate(
        self,
        model: str,
        key: str,
        shape: tuple[int, int, int],
        use_cache: bool | None,
        seed: int,
    ) -> Sample:
        """One timed ``generate`` of ``shape`` (rows, prompt length, new tokens) on fresh
        prompts of pool ``key``; its new tokens must be the reference's, or the check
        fails (a run whose answer is wrong cannot count). ``use_cache`` None leaves it to
        generate's default."""
        rows, prompt_len, new_tokens = shape
        vocab = self.model_spec(model)["config"]["vocab_size"]
        prompts, expected = self.take(key, rows, prompt_len, vocab, seed)
        pool = self.pool(key)
        temperature = pool["temperature"] if pool else 1.0
        tokens, self.last_lengths, sample = self.generate_or_fail(
            timing=True,
            model=model,
            prompt=prompts,
            batch=1,
            new_tokens=new_tokens,
            temperature=temperature,
            use_cache=use_cache,
            seed=seed,
        )
        if expected is not None:  # a run shorter than the pool's checks their first tokens
            got, want = tokens[:, prompt_len:], np.asarray(expected)[:, :new_tokens]
            if not np.array_equal(got, want):
                row, k = (int(x) for x in np.argwhere(got != want)[0])
                self.note_detail(HIDDEN_ANSWER, True)
                self.fail(
                    f"A timed generate({cache_argument(use_cache)}) of {new_tokens} tokens after "
                    f"{rows} prompt(s) of {prompt_len} tokens, at temperature {temperature:g} "
                    "(so the model's top token every step), returned other tokens than the "
                    f"reference (first difference: row {row + 1} of {rows}, new token {k + 1}): "
                    "its time cannot count. Every timed run has prompts of its own; the answer "
                    "must be computed for them."
                )
        if expected is None:
            self.same_as_cache_free(key, seed, use_cache, prompt_len, tokens)
        return sample

    def work_probe(self) -> tuple[Ratio, dict[str, Timing]]:
        """CPU time of cached against cache-free ``generate`` (``WORK_NEW`` tokens after
        ``WORK_BATCH`` prompts of ``WORK_PROMPT`` tokens, on the CPU, interleaved
        ``WORK_ROUNDS`` times), every
        run's tokens checked against the reference's. Measured by the grader: a "cache"
        that recomputes the prefix cannot do less work than no cache. The cached runs
        leave ``use_cache`` to its default, which the handout's signature sets to True."""
        return self.interleaved_work(WORK_ROUNDS, self.work_run, threshold=self.min_work_ratio)

    def work_run(self, cache: bool, i: int) -> Sample:
        """One timed run of the work probe: cached (``use_cache`` at its default) or not."""
        self.ensure_model("work")
        shape = (WORK_BATCH, WORK_PROMPT, WORK_NEW)
        return self.timed_generate("work", "work", shape, None if cache else False, seed=i)

    def bench_run(self, cached: bool | None, i: int) -> Sample:
        """One timed run of check 2.11's workload: a prompt of its own, the reference's
        tokens to match; a warm-up round's shorter (:func:`round_length`)."""
        bench = load_thresholds(self.ctx.device)["part2"]
        shape = (1, bench["prompt_len"], round_length(bench["new_tokens"], bench, i))
        return self.timed_generate("bench", bench_key(bench), shape, cached, i)

    def yardstick_workloads(self) -> dict[str, Workload]:
        """The reference's cached runs of the work probe (2.9) and of check 2.11."""
        bench = load_thresholds(self.ctx.device)["part2"]
        cached = (lambda _, i: self.bench_run(True, i), [WITH], bench)
        return {**self.work_workload(), "bench": cached}

    def work_advice(self, ratio: Ratio, cpu: dict[str, float]) -> str:
        """Why this part's cached path failed the work probe, for the student."""
        return (
            "generate with use_cache left at its default (True in the handout's signature) "
            "did not do less work than generate(use_cache=False): "
            f"generating {WORK_NEW} tokens after {WORK_BATCH} prompts of {WORK_PROMPT} tokens "
            "took "
            f"{cpu['with the cache']:.0f} ms of CPU time with the cache and "
            f"{cpu['without the cache']:.0f} ms without it ({ratio.median:.2f}x; a working "
            f"cache needs at least {MIN_WORK_RATIO:g}x here, as every step without it "
            "reprocesses the whole sequence). With the cache, each step after the prompt must "
            "process only the newest token and reuse the cached keys and values."
        )


class Part2Growth(Part2Timed):
    """Check 2.9's growth probe: the cached path measured against itself alone."""

    max_cached_growth = MAX_CACHED_GROWTH
    growth_shape = (GROWTH_BATCH, GROWTH_PROMPT, GROWTH_SHORT, GROWTH_LONG)
    growth_label = "use_cache left at its default"
    growth_calls: list[tuple[list[int] | None, int]]  # each growth run's calls, new tokens

    def growth_probe(self) -> Ratio:
        """CPU seconds per generated token of cached ``generate`` (use_cache left at its
        default), ``GROWTH_LONG`` new tokens over ``GROWTH_SHORT``, after ``GROWTH_BATCH``
        prompts of ``GROWTH_PROMPT`` tokens on the work model, one round where it decides
        (the reference reads about 1x, a recomputed prefix far over the maximum), else
        ``GROWTH_ROUNDS`` in all, every run on prompts of its own with its tokens checked
        against the reference's.
        A cache keeps every step's cost nearly flat; recomputing the prefix makes the long
        run's steps dearer. The submission's cache-free path plays no part in it."""
        self.ensure_model("work")
        self.growth_calls = []

        def run(new_tokens: int, i: int) -> Sample:
            shape = (GROWTH_BATCH, GROWTH_PROMPT, new_tokens)  # (rows, prompt, new tokens)
            sample = self.timed_generate("work", "growth", shape, None, seed=i)
            self.growth_calls.append((self.last_lengths, new_tokens))
            return sample

        return self.cached_growth(
            GROWTH_ROUNDS,
            run,
            GROWTH_SHORT,
            GROWTH_LONG,
            threshold=self.max_cached_growth,
            first_counts=True,
        )

    def growth_calls_problem(self) -> str:
        """Why a growth run's forward calls were not the prompt once and then one token per
        call ("" when none was; :func:`calls_problem`): its long runs of ``GROWTH_LONG``
        new tokens show a ``generate`` that starts over every few steps, at any period up
        to 64, where the benchmark's runs are too short to."""
        for lengths, new_tokens in self.growth_calls:
            problem = calls_problem([lengths], GROWTH_PROMPT, new_tokens)
            if problem:
                return problem
        return ""

    def growth_advice(self, growth: Ratio) -> str:
        """Why this part's cached path failed the growth probe, for the student."""
        return (
            "generate with use_cache left at its default did not keep the cost of a step "
            f"flat: after {GROWTH_BATCH} prompts of {GROWTH_PROMPT} tokens, each new token "
            f"cost {growth.median:.2f}x more CPU time when generating {GROWTH_LONG} tokens "
            f"than when generating {GROWTH_SHORT} (a working cache stays within "
            f"{MAX_CACHED_GROWTH:g}x: each step processes one token against the cached keys "
            "and values). Your cached path recomputes the sequence so far at every step, "
            "whatever generate(use_cache=False) costs."
        )


class Part2CacheContents(Part2Growth):
    """What the cache holds: the keys and values of the tokens seen, as the course's
    ``LayerCache`` says ((K, V), each (B, T_total, D)), compared with the reference's, no
    wider than the model's weights, and read by forward at every step."""

    def cache_problem(self) -> str:
        """Why the cache does not hold each layer's keys and values, is wider than the
        weights or is not read at every step ("" when none applies; the first two need the
        hidden cases). Once per grading."""
        return self.once_per_grading("cache_problem", self.look_at_cache)

    def look_at_cache(self) -> str:
        """What the cache holds against the reference's keys and values (with the hidden
        cases), its width, and whether forward reads it at every step (always: that probe
        needs no expected values)."""
        return self.cache_contents() or self.cache_read_problem()

    def cache_contents(self) -> str:
        """Why the cache after the hidden cases' prefill and two steps is not the
        reference's keys and values, or wider than the model's weights ("" when it is
        neither, or without the hidden cases)."""
        probe = self.meta().get("cache_values")
        if not probe:
            return ""
        ids = np.asarray(probe["input_ids"], dtype=np.int64)
        steps = probe["steps"]
        self.ensure_model(probe["model"])
        header = {"op": "cache_values", "model": probe["model"], "steps": steps}
        what = f"forward with the cache ({steps[0]} prompt tokens, then single tokens)"
        reply = self.ctx.worker(self.part).request(header, {"input_ids": ids}, what=what)
        return cache_contents_problem(probe, reply.arrays, self.atol()) or cache_dtype_problem(
            reply.header.get("dtypes")
        )

    def cache_read_problem(self) -> str:
        """Whether forward reads its cache at every step: after a prefill of
        ``CACHE_READ_PREFIX`` tokens on the public model, the worker writes noise, in place,
        over every tensor shaped like keys or values of the prefix that the next step may
        read: in the past_kv forward handed back, and among those the model keeps outside
        its parameters that the prefill wrote (a cache held on the layers and handed back
        as views or as a copy; ``adapter_cache``). It then feeds ``CACHE_READ_STEPS`` single
        tokens, each call given the cache the last one returned, and compares the last
        step's logits with those of the same steps after an unscrambled prefill. A forward
        that runs the whole prefix again every few calls (its calls one token each, like a
        cache's) has healed by then. The figure comes from the submission's process: it
        names an honest design, and the yardstick stops a forger. "" when the cache is read
        or the probe cannot run."""
        config = self.model_spec("public")["config"]
        prefix = min(CACHE_READ_PREFIX, config["max_seq_len"] - CACHE_READ_STEPS)
        if prefix < 1:
            return ""
        rng = np.random.default_rng(CACHE_READ_SEED)
        ids = rng.integers(0, config["vocab_size"], (CACHE_READ_ROWS, prefix + CACHE_READ_STEPS))
        header = {
            "op": "cache_read",
            "model": "public",
            "prefix": prefix,
            "width": config["d_model"],
        }
        what = "scrambling the cache forward handed back after a prefill"
        try:
            self.ensure_model("public")
            reply = self.ctx.worker(self.part).request(header, {"input_ids": ids}, what=what)
        except SubmissionError:
            return ""  # the checks of forward name why it cannot run
        return cache_read_verdict(reply.header.get("effect"), prefix)


def cache_read_verdict(effect: Any, prefix: int) -> str:
    """Why the cache-read probe's ``effect`` (the largest change of the last step's logits
    with the cache scrambled after a prefill of ``prefix`` tokens) shows a forward that
    does not read its cache ("" when it reads it). No figure (None: neither past_kv nor
    the model held a tensor shaped like keys or values, or none could be written, so the
    other checks judge alone) names nothing; NaN never passes."""
    outcome = cache_read_outcome(effect, CACHE_READ_MIN_EFFECT)
    if outcome in (None, "reads"):
        return ""
    if outcome == "nan":
        return (
            f"after a prefill of {prefix} tokens and {CACHE_READ_STEPS} single-token steps "
            "with the cache, the last step's logits were NaN, so whether forward reads its "
            "cache could not be seen."
        )
    return (
        f"forward does not read its cache: noise written, right after a prefill of {prefix} "
        "tokens, over the keys and values in the past_kv forward handed back and in the "
        f"tensors the model keeps left the logits unchanged {CACHE_READ_STEPS} single-token "
        "steps later, each call given the cache the last one returned (largest change "
        f"{effect:.2g}). With use_cache, the keys and values of earlier positions must come "
        "from the cache at every step, not be computed again, at once or every few steps."
    )


def cache_contents_problem(
    probe: dict[str, Any], arrays: dict[str, np.ndarray], atol: float
) -> str:
    """Why the cache the worker returned (``arrays``: ``k0``, ``v0``, ``k1``, ... as the
    submission's forward handed them back after the calls of ``probe``) does not hold each
    layer's keys and values, compared with the reference's ("" when it does). Where the
    student keeps the cache (grown, preallocated, copied at every call, held on the layers)
    does not matter: only what forward hands back as past_kv. NaN never passes."""
    seen = f"after forward calls of {' + '.join(map(str, probe['steps']))} tokens"
    for i, (keys, values) in enumerate(zip(probe["k"], probe["v"], strict=True)):
        for name, want in (("keys", decode_array(keys)), ("values", decode_array(values))):
            got = arrays.get(f"{name[0]}{i}")
            if not isinstance(got, np.ndarray) or got.shape != want.shape:
                shape = "nothing" if got is None else f"shape {tuple(got.shape)}"
                return (
                    f"{seen}, layer {i}'s cache holds {shape} where its {name} belong, "
                    f"{tuple(want.shape)} (B, T_total, D)."
                )
            diff = float(np.max(np.abs(got.astype(np.float64) - want)))
            if not diff <= atol:  # NaN fails
                return (
                    f"{seen}, layer {i}'s cache does not hold the {name} of the tokens "
                    f"seen (largest difference from the reference's {diff:.3g}). A cache "
                    "must keep each layer's K = W_k(x) and V = W_v(x) (after the layer's "
                    "norm), so that a step projects its new token only; storing anything "
                    "from which every step recomputes them is not a KV cache."
                )
    return ""


#: Bytes per element of the float dtypes a model or its cache may hold.
FLOAT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def cache_dtype_problem(dtypes: Any) -> str:
    """Why the cache takes more memory than the keys and values need: a cache tensor of a
    wider float than any of the model's weights (a float64 cache beside float32 weights
    holds every key and value in twice the bytes). ``dtypes`` is what the worker reported
    of the tensors forward handed back as the cache and of the model's parameters
    ({"cache": [...], "model": [...]}); "" when the cache is no wider, or the report says
    nothing that can be judged. A float64 model's float64 cache is its own width."""
    if not isinstance(dtypes, dict):
        return ""
    cache, model = dtypes.get("cache"), dtypes.get("model")
    if not (isinstance(cache, list) and isinstance(model, list)):
        return ""
    widest = max((FLOAT_BYTES.get(d, 0) for d in model if isinstance(d, str)), default=0)
    wider = sorted({d for d in cache if isinstance(d, str) and FLOAT_BYTES.get(d, 0) > widest})
    if not widest or not wider:
        return ""
    weights = ", ".join(d for d in model if d in FLOAT_BYTES)
    return (
        f"the cache forward hands back holds {', '.join(wider)} tensors where the model's "
        f"weights are {weights}: every cached key and value takes "
        f"{max(FLOAT_BYTES[d] for d in wider) // widest}x the memory the model's own "
        "precision needs, and the cache is the memory that grows with every token. Keep "
        "K and V in the dtype the layer computed them in."
    )


def calls_problem(runs: list[list[int] | None], prompt_len: int, new_tokens: int) -> str:
    """Why the cached runs' forward calls were not a prefill and then one token per call
    ("" when they were; see :mod:`grader.judging.calls`)."""
    for lengths in runs:
        if lengths is None:
            continue
        fed = sum(lengths)
        if not fed_once(lengths, prompt_len) or not (
            prompt_len + new_tokens - 1 <= fed <= prompt_len + new_tokens
        ):
            return (
                f"in a timed cached run, forward received {shown(lengths)} tokens "
                f"per call, {fed} in all, for a prompt of {prompt_len} tokens and {new_tokens} "
                "new tokens. A cache feeds the prompt once, then only the newest token "
                f"({prompt_len + new_tokens - 1} in all); feeding more (starting over every "
                "few steps, or the last few tokens again) recomputes part of the work."
            )
    return ""


def cache_argument(use_cache: bool | None) -> str:
    """How a timed run passed ``use_cache``, for messages."""
    return "use_cache left at its default" if use_cache is None else f"use_cache={use_cache}"


def bench_key(bench: dict[str, Any]) -> str:
    """The pool of check 2.11's timed runs under the thresholds profile ``bench``."""
    return pool_key(bench["prompt_len"], bench["new_tokens"], bench.get("model"))
