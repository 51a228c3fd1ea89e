"""Part 2 checks: the tiny decoder-only transformer and its KV cache.

Logits are checked without the cache, with it over the whole sequence, one
token at a time and in chunks, on the public course cases and on hidden ones.
``generate`` is checked for what it does: the same tokens with and without the
cache, one new token per cached ``forward`` call (recorded in the worker: a
hint that names a mistake, never proof, since the submission could rewrite
it), less work with the cache than without and a cached step whose cost does
not grow with the length (CPU time read by the grader, check 2.9), temperature
honoured. Its speed is then timed by the grader itself
on prompts nobody has seen, every answer checked (check 2.11).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.core.thresholds import load_thresholds
from grader.judging.base import check, likely_cause, with_output
from grader.judging.logits import position
from grader.parts.part2 import isolate, isolate_forward, isolate_generate, isolate_sampling
from grader.parts.part2.cases import frequency_band, softmax64
from grader.parts.part2.support import Part2Base
from grader.parts.part2.timed import Part2CacheContents, Part2Growth, bench_key, calls_problem
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import (
    BenchmarkRecord,
    Criterion,
    Ratio,
    Sample,
    Timing,
    clock_for,
    round_length,
)


class Part2ForwardChecks(Part2Base):
    def isolate(self, model: str) -> None:
        """After a check of logits failed with no known mistake named, the place narrowed
        by experiment on ``model`` (:mod:`grader.parts.part2.isolate_forward`): its cause
        named, its lines after the failing cases. A known mistake's words stand alone."""
        if self.feedback.causes:
            return
        causes, lines = isolate_forward.narrow_forward(self, model)
        self.name(causes)
        self.feedback.notes.extend(lines)

    # -------------------------------------------------------------- checks

    @check("2.1")
    def test_load_state_dict(self) -> None:
        try:
            self.ensure_model("public", full=True)
        except SubmissionError as exc:
            self.fail(with_output(exc.message, exc.output))

    @check("2.2")
    def test_logits_without_cache(self, set_score: Any = None) -> None:
        self.score("2.2", self.run_public("2.2", "no_cache", "expected_logits_no_cache"), set_score)

    @check("2.3")
    def test_logits_with_cache_full_sequence(self, set_score: Any = None) -> None:
        outcome = self.run_public(
            "2.3", "full_cache", "expected_logits_with_cache", shapes_check=True
        )
        self.score("2.3", outcome, set_score)

    @check("2.4")
    def test_logits_one_token_at_a_time(self, set_score: Any = None) -> None:
        outcome = self.run_public(
            "2.4", "sequential", "expected_logits_sequential", shapes_check=True
        )
        self.score("2.4", outcome, set_score)

    @check("2.5")
    def test_prefill_then_chunks(self, set_score: Any = None) -> None:
        self.score("2.5", self.run_public("2.5", "chunks", "expected_logits_no_cache"), set_score)

    @check("2.6")
    def test_hidden_without_cache(self, set_score: Any = None) -> None:
        self.require_hidden()
        self.score("2.6", self.run_hidden("2.6"), set_score, what="hidden cases")

    @check("2.7")
    def test_hidden_with_cache(self, set_score: Any = None) -> None:
        self.require_hidden()
        self.score("2.7", self.run_hidden("2.7"), set_score, what="hidden cases")


class Part2GenerateChecks(Part2Growth):
    def isolate_generate(self) -> None:
        """generate's output against the reference's, token by token
        (:mod:`grader.parts.part2.isolate_generate`): its causes named, its line added."""
        causes, lines = isolate_generate.narrow_generate(self)
        self.name(causes)
        self.feedback.notes.extend(x for x in lines if x not in self.feedback.notes)

    # -------------------------------------------------------------- checks

    @check("2.8")
    def test_generate_same_tokens(self) -> None:
        cached, _, _ = self.generate_or_fail(use_cache=True)
        plain, _, _ = self.generate_or_fail(use_cache=False)
        print(self.generate_convention())
        if not np.array_equal(cached, plain):
            row, col = np.argwhere(cached != plain)[0]
            self.isolate_generate()
            self.fail(
                "With the same seed, generate(use_cache=True) and generate(use_cache=False) "
                "returned different tokens (first difference: batch row "
                f"{row + 1} of {len(cached)}, {position(int(col), cached.shape[1])}, prompt "
                "included). "
                "Both must compute the same logits and sample them the same way."
            )

    @check("2.9")
    def test_generate_feeds_one_token(self) -> None:
        # The forward calls are recorded in the worker, where the submission could rewrite
        # the record: they name a mistake, and only the work the grader measures (a cached
        # run must cost far less CPU time than a cache-free one) gives the points.
        settings = self.meta()["generate"]
        prompt_len, n = len(settings["prompt"][0]), settings["new_tokens"]
        cached, lengths, _ = self.generate_or_fail(use_cache=True)
        plain, plain_lengths, _ = self.generate_or_fail(use_cache=False)
        problems = []
        if not lengths:
            problems.append(
                "generate(use_cache=True) never called the model's forward (the grader counts "
                "the tokens each forward call receives); call self(...) or self.forward(...)."
            )
        elif not prompt_len + n - 1 <= sum(lengths) <= prompt_len + n:
            # Every prompt token and every new token but the last goes through forward
            # once (a last, unused call is tolerated): a prefill that skips part of the
            # prompt feeds fewer, one that re-feeds the sequence more.
            problems.append(
                f"With use_cache=True, forward received {lengths} tokens per call, "
                f"{sum(lengths)} in all, for a prompt of {prompt_len} tokens and {n} new "
                f"tokens: the whole prompt must go through forward once (the prefill), then "
                f"each new token once ({prompt_len + n - 1} tokens in all)."
            )
            names = self.mistakes_by_call_lengths(lengths, cached, plain)
            self.name(likely_cause(names, self.meta()["diagnoses"], "the tokens per call"))
        elif any(x != 1 for x in lengths[1:]):
            problems.append(
                f"With use_cache=True, forward received {lengths} tokens per call for a "
                f"prompt of {prompt_len} tokens and {n} new tokens. After the first call (the "
                "prompt), each call must receive only the newest token."
            )
            names = self.mistakes_by_call_lengths(lengths, cached, plain)
            self.name(likely_cause(names, self.meta()["diagnoses"], "the tokens per call"))
        if plain_lengths and plain_lengths != list(range(prompt_len, prompt_len + n)):
            problems.append(
                f"With use_cache=False, forward received {plain_lengths} tokens per call; "
                "without a cache every call must process the whole sequence so far "
                f"({list(range(prompt_len, prompt_len + n))})."
            )
        if problems:
            self.fail("\n".join(problems))
        # All in CPU time: the work ratio compares the two paths, the growth the cached path
        # with itself, the yardstick with the reference's (a cache-free path slowed on
        # purpose moves none of the last two).
        problem = self.work_problem()
        if problem:
            self.fail(problem)

    def mistakes_by_call_lengths(
        self, lengths: list[int], cached: np.ndarray, plain: np.ndarray
    ) -> list[str]:
        """Catalogued mistakes whose cached ``generate`` made the same forward calls.

        Several mistakes share call lengths (the whole sequence fed at every step
        with or without the cache); the tokens tell them apart: a mistake whose
        cached tokens differ from the reference's is catalogued with them, one
        whose tokens are right matches a submission whose two modes agree.
        """
        names = [k for k, v in self.signatures("generate_lengths").items() if v == lengths]
        tokens = self.signatures("generate_tokens")
        same_modes = np.array_equal(cached, plain)
        narrowed = [
            name
            for name in names
            if (name in tokens and tokens[name] == cached.tolist())
            or (name not in tokens and same_modes)
        ]
        return narrowed or names

    @check("2.10")
    def test_temperature(self) -> None:
        settings = self.meta()["generate"]
        low = {
            "batch": settings["low_batch"],
            "new_tokens": settings["low_new_tokens"],
            "temperature": settings["low_temperature"],
            "use_cache": True,
        }
        self.check_sampling()
        tokens, _, _ = self.generate_or_fail(**low)
        prompt_len, n = len(settings["prompt"][0]), low["new_tokens"]
        # Your own model's ranking, through the same cached path generate uses.
        steps = [prompt_len] + [1] * (n - 1)
        try:
            logits, _ = self.forward("public", tokens[:, :-1], steps, what="forward (cached)")
        except SubmissionError:
            logits, _ = self.forward("public", tokens[:, :-1], None, what="forward (no cache)")
        top = np.asarray(logits)[:, prompt_len - 1 :, :].argmax(-1)
        hits = int((top == tokens[:, prompt_len:]).sum())
        if hits == top.size:
            return
        plain = self.low_temperature_hits({**low, "use_cache": False})
        setting = f"At temperature {low['temperature']}"
        if plain is not None and plain[0] == plain[1]:
            self.fail(
                f"{setting}, generate(use_cache=False) picked the token your own model ranks "
                f"highest every time, so the temperature is applied; with use_cache=True only "
                f"{hits} of {top.size} sampled tokens were the top token of your own forward "
                "with the cache (the prompt, then one token per call). The cached generate "
                "computes other logits than that forward, or samples them another way: see "
                "checks 2.8 and 2.9."
            )
        names = [
            k
            for k, v in self.signatures("low_temperature").items()
            if isinstance(v, list) and np.array_equal(np.array(v), tokens)
        ]
        known = likely_cause(names, self.meta()["diagnoses"], "the sampled tokens")
        causes, lines = isolate_sampling.low_temperature_causes(
            self, known, lambda: self.temperature_lost(low["temperature"])
        )
        self.name(causes)
        self.feedback.notes.extend(lines)
        both = "" if plain is None else f" (without the cache: {plain[0]} of {plain[1]})"
        self.fail(
            f"{setting}, only {hits} of {top.size} sampled tokens{both} were the token your "
            "own model ranks highest; dividing the logits by a tiny temperature makes "
            "sampling (almost) greedy."
        )

    def sampling_frequency(self, temperature: float | None) -> tuple[float, float, int, int]:
        """The first new token after the sampling probe's prompt, drawn rows x calls times
        (seeds 0, 1, ...) at ``temperature`` (None: generate's default): how often it was
        the likeliest token of the submission's own cache-free forward, that token's
        probability under softmax(logits / 1.0), the token, and the number of draws."""
        probe = self.meta()["sampling"]
        ids = np.array(probe["prompt"], dtype=np.int64)
        logits, _ = self.forward("public", ids, None, what="forward (no cache)")
        if not isinstance(logits, np.ndarray) or logits.ndim != 3:
            self.fail("forward(input_ids, use_cache=False) did not return (B, T, vocab) logits.")
        z = logits[0, -1]
        top = int(np.argmax(z))
        p = float(softmax64(z)[top])
        drawn = []
        for seed in range(probe["calls"]):
            run = {"batch": probe["rows"], "new_tokens": 1, "use_cache": True, "seed": seed}
            tokens, _, _ = self.generate_or_fail(
                prompt=probe["prompt"], temperature=temperature, **run
            )
            drawn.append(tokens[:, ids.shape[1]])
        draws = np.concatenate(drawn)
        return float(np.mean(draws == top)), p, top, int(draws.size)

    def check_sampling(self) -> None:
        """``generate`` with its temperature left at the default (1.0 in the handout's
        signature) draws the next token from softmax(logits / 1.0) of the model's own
        logits: the likeliest token comes up as often as its probability says (within a
        band of several standard deviations, so a correct sampler with any seeding passes)."""
        probe = self.meta()["sampling"]
        freq, p, top, n = self.sampling_frequency(None)
        band = frequency_band(p, n, probe["sigmas"])
        if abs(freq - p) <= band:  # False for NaN
            return
        lines = [
            f"generate(input_ids, 1) with temperature left at its default was run on "
            f"{probe['rows']} copies of a prompt, {probe['calls']} times (seeds 0 to "
            f"{probe['calls'] - 1}). The first new token was your model's likeliest one "
            f"(id {top}, probability {p:.3f} under softmax(logits / 1.0) of your own forward "
            f"without the cache) {freq:.3f} of the time; accepted: {max(0.0, p - band):.3f} "
            f"to {min(1.0, p + band):.3f}."
        ]
        # The draws came from a batch through the cached prefill: the sampler is named only
        # when those logits are the prompt alone's (grader/parts/part2/isolate.py).
        if other := isolate.sampling_not_to_blame(self, probe["prompt"], probe["rows"]):
            self.name([other])
            lines.append(f"Before the sampler is blamed: {other.evidence}.")
            self.fail("\n".join(lines))
        try:
            explicit, _, _, _ = self.sampling_frequency(1.0)
        except self.failureException:
            explicit = float("nan")
        if abs(explicit - p) <= band:
            lines.append(
                f"With temperature=1.0 passed explicitly it came up {explicit:.3f} of the time, "
                "as it should: generate's default temperature must be 1.0, as in the "
                "handout's signature."
            )
            self.fail("\n".join(lines))
        # The sampler alone, the temperature varied alone (isolate_sampling): it is blamed
        # only where it is wrong on its own.
        causes, found, blame = isolate_sampling.default_temperature_causes(self)
        self.name(causes)
        lines.append("With temperature=1.0 passed explicitly it was no better.")
        if blame:
            lines[-1] += (
                " sample must draw from softmax(logits / temperature), the logits divided by "
                "the temperature as real numbers."
            )
        self.fail("\n".join(lines + found))

    def temperature_lost(self, temperature: float) -> str:
        """Evidence that generate draws at ``temperature`` (very low) as at 1.0: the sampling
        probe's likeliest token as often as its probability at 1.0 says, not nearly always
        ("" when not, or when the probe cannot run)."""
        probe = self.meta()["sampling"]
        try:
            freq, p, _, n = self.sampling_frequency(temperature)
        except self.failureException:
            return ""
        if abs(freq - p) > frequency_band(p, n, probe["sigmas"]) or p > 0.9:
            return ""
        return (
            f"generate at temperature {temperature:g} drew the sampling probe's likeliest "
            f"token {freq:.3f} of the time, as at 1.0 (probability {p:.3f}), where it "
            "should be nearly always"
        )

    def low_temperature_hits(self, settings: dict[str, Any]) -> tuple[int, int] | None:
        """How many of cache-free ``generate``'s tokens at a very low temperature are the
        top token of the submission's own cache-free forward, out of how many; None when
        either call fails."""
        prompt_len = len(self.meta()["generate"]["prompt"][0])
        try:
            tokens, _, _ = self.generate(**settings)
            logits, _ = self.forward("public", tokens[:, :-1], None, what="forward (no cache)")
        except (SubmissionError, self.failureException):
            return None
        top = np.asarray(logits)[:, prompt_len - 1 :, :].argmax(-1)
        return int((top == tokens[:, prompt_len:]).sum()), int(top.size)


class Part2Benchmark(Part2CacheContents):
    """Runs after the other checks: a slow generate here cannot cost them their time."""

    @check("2.11")
    def test_benchmark_speedup(self) -> None:
        bench = load_thresholds(self.ctx.device)["part2"]
        self.require_pool(bench, bench_key(bench))
        variants = {"without the cache": False, "with the cache": True}
        clock = clock_for(self.ctx.device)

        cached_calls: list[tuple[list[int] | None, int]] = []  # (call lengths, new tokens)

        def timed_run(variant: str, i: int) -> Sample:
            sample = self.bench_run(variants[variant], i)
            if variants[variant]:  # with the new tokens it made (a warm-up's are fewer)
                cached_calls.append(
                    (self.last_lengths, round_length(bench["new_tokens"], bench, i))
                )
            return sample

        reference = self.yardstick("bench")

        def judge(timings: dict[str, Timing]) -> list[Criterion]:
            speedup = Ratio.of(timings["without the cache"], timings["with the cache"], clock)
            label = f"speedup ({clock} time)"
            return [
                Criterion("part2.min_speedup", label, speedup, bench["min_speedup"], True),
                *self.versus_reference(timings, reference, bench, clock),
            ]

        def lost() -> str:
            problems = (calls_problem([c], bench["prompt_len"], n) for c, n in cached_calls)
            return next(filter(None, problems), "")

        record = BenchmarkRecord(check="2.11", profile=self.ctx.device)
        record.add(self.measure_benchmark(timed_run, variants, judge, bench, lost))
        record.add_reference(reference)
        cached = record.timings["with the cache"]
        record.leaderboard = {
            "tokens_per_s": bench["new_tokens"] / cached.median,
            "speedup": record.criteria[0].ratio.median,
        }
        # The timed runs' own calls name a cause whether or not a threshold was missed
        # (on a loaded machine a partial cache may miss one first): the advice says it.
        fed_again = lost()
        self.report_benchmark(
            record,
            f"Benchmark: {bench['new_tokens']} new tokens after a "
            f"{bench['prompt_len']}-token prompt",
            f"The speedup cannot count: {fed_again}"
            if fed_again
            else "With a working cache each step after the prompt processes one token instead "
            "of the whole sequence.",
        )
        # The speedup compares two paths of the submission's own; a cache-free path slowed
        # on purpose inflates it, so the cached path must also keep its steps' cost flat,
        # and what it caches must be the keys and values.
        problem = fed_again or self.growth_problem() or self.cache_problem()
        if problem:
            self.fail(f"The speedup cannot count: {problem}")
