"""Part 3 checks: KV caching in the Llama 3 reference code.

The student's ``Llama`` is built in the worker twice (``kv_caching`` on and
off) from the tiny checkpoint in Meta's layout, and once more from hidden
weights of other sizes. Forward logits, greedy generation in both modes, the
call pattern of the cached decode loop (recorded in the worker), the cached path's
work (less than without the cache, and per token flat in the length: CPU time read by
the grader), a second ``generate`` after a first one, ``sample_top_p`` and the speed
ratio are checked.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from grader.core.feedback import memory_label
from grader.core.points import points
from grader.core.thresholds import load_thresholds
from grader.judging.base import Outcome, check, with_output
from grader.parts.part3 import isolate, isolate_sampling
from grader.parts.part3.cache_contents import Part3CacheContents
from grader.parts.part3.cases import TOP_P, TOP_P_NUCLEUS, TOP_P_PROBS
from grader.parts.part3.course import UNSCALED, UNSCALED_NOTE
from grader.parts.part3.isolation import Part3Isolation
from grader.parts.part3.probes import Part3Probes
from grader.parts.part3.timed import Part3Timed, bench_key, calls_problem
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import BenchmarkRecord, Criterion, Ratio, Sample, Timing, clock_for


class Part3ForwardChecks(Part3Isolation, Part3Probes):
    def run_cases(self, num: str, modes: tuple[str, ...], set_score: Any) -> None:
        outcome = Outcome()
        wrong: list[str] = []
        for case in self.cases(num):
            for mode in modes:
                outcome.total += 1
                problem = self.check_case(case, mode)
                if problem is not None:
                    outcome.failures.append(problem)
                    wrong += [] if mode in wrong else [mode]
                else:
                    outcome.passed += 1
        set_score(round(points(num) * outcome.fraction, 4))
        self.say_count(outcome.passed, outcome.total)
        if outcome.failures:
            right = [m for m in modes if m not in wrong]
            if num != "3.4":
                self.diagnose_forward(wrong, right)  # names the causes in the feedback
            self.isolate("hidden" if num == "3.4" else "public")
            self.fail_with(outcome.listing())

    @check("3.1")
    def test_build(self) -> None:
        errors = []
        for cache in (True, False):  # both, so that this check shows either's failure
            try:
                self.ensure("public", cache, full=True)
            except SubmissionError as exc:
                errors.append(exc)
        if errors:
            self.fail(with_output(errors[0].message, errors[0].output))
        self.print_build_notes()
        problems = self.build_error_problems()
        problems += self.capacity_problems()
        problems += self.memory_problems()
        problems += self.cache_size_problems()
        if problems:
            self.fail("\n".join([*problems, self.reported_shapes()]).strip())

    @check("3.2")
    def test_forward_without_cache(self, set_score: Any = None) -> None:
        if self.rope() == UNSCALED:
            print(UNSCALED_NOTE)
        self.run_cases("3.2", ("no_cache",), set_score)

    @check("3.3")
    def test_forward_with_cache(self, set_score: Any = None) -> None:
        self.run_cases("3.3", ("cached", "chunked"), set_score)

    @check("3.4")
    def test_hidden_forward(self, set_score: Any = None) -> None:
        self.require_hidden()
        self.run_cases("3.4", ("no_cache", "cached", "chunked"), set_score)

    def cases(self, num: str) -> list[dict[str, Any]]:
        # 3.3 reuses 3.2's public cases with the cache on.
        return super().cases("3.2" if num == "3.3" else num)


class Part3GenerateChecks(Part3Isolation, Part3CacheContents, Part3Timed, Part3Probes):
    @check("3.5")
    def test_greedy_generation(self) -> None:
        want = self.meta()["expected_texts"]
        problems = []
        for cache in (True, False):
            reply = self.handout_generation(cache)
            got = self.texts(reply)
            wrong = [i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b]
            if len(got) != len(want) or wrong:
                probe = "generate_cached" if cache else "generate_no_cache"
                before = len(self.feedback.causes)
                cause = self.generation_cause(reply, want) or self.name_mistakes(probe, got)
                prompts = self.meta()["generate"]["prompts"]
                self.isolate_generation(before, reply, prompts, want, cache)
                problems.append(
                    f"generate(kv_caching={cache}) at temperature 0 gave other text than the "
                    f"reference for prompt(s) {[i + 1 for i in wrong] or 'all'}. {cause}"
                )
        problems += self.full_batch_problems()
        if problems:
            self.fail("\n".join(problems))

    def full_batch_problems(self) -> list[str]:
        """Greedy text of a batch that fills the cache: ``max_batch_size`` prompts, the
        longest exactly ``max_seq_len`` tokens (Meta's guard refuses only longer ones), so
        decoding runs to the last cache slot; then a batch whose first continuation reaches
        a stop token, where the text must end."""
        problems = []
        full = self.meta().get("full_generate")
        if full:
            setting = (
                f"on {len(full['prompts'])} prompts (max_batch_size) of {full['prompt_tokens']} "
                f"tokens, the longest exactly max_seq_len = {self.meta()['max_seq_len']}"
            )
            problems += self.batch_problems(full, setting)
        stop = self.meta().get("stop_generate")
        if stop:
            setting = (
                f"on {len(stop['prompts'])} prompts of {stop['prompt_tokens'][0]} tokens, the "
                "first one's continuation reaching <|eot_id|> (the text ends before it)"
            )
            problems += self.batch_problems(stop, setting)
        return problems

    def batch_problems(self, case: dict[str, Any], setting: str) -> list[str]:
        """What differs from the reference's greedy text of ``case`` in either mode."""
        problems = []
        for cache in (True, False):
            try:
                reply = self.generate(
                    case["prompts"], cache, max_gen_len=case["max_gen_len"], record_tokens=True
                )
            except SubmissionError as exc:
                problems.append(
                    f"generate(kv_caching={cache}) {setting}: "
                    + with_output(exc.message, exc.output)
                )
                continue
            got, want = self.texts(reply), case["expected_texts"]
            wrong = [i + 1 for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b]
            if len(got) != len(want) or wrong:
                before = len(self.feedback.causes)
                problems.append(
                    f"generate(kv_caching={cache}) at temperature 0 {setting}, gave other "
                    f"text than the reference for prompt(s) {wrong or 'all'}. "
                    + self.generation_cause(reply, want)
                )
                self.isolate_generation(
                    before, reply, case["prompts"], want, cache, max_gen_len=case["max_gen_len"]
                )
        return problems

    @check("3.6")
    def test_step_logits_agree(self) -> None:
        cached = self.handout_generation(True).arrays.get("step_logits")
        plain = self.handout_generation(False).arrays.get("step_logits")
        if not isinstance(cached, np.ndarray) or cached.ndim != 3 or cached.shape != plain.shape:
            self.fail(
                "The two modes made different numbers of forward calls (or returned logits of "
                "different shapes); see check 3.7."
            )
        err = np.abs(cached - plain).max(axis=(1, 2))
        bad = np.flatnonzero(~(err <= self.atol()))  # NaN is never within tolerance
        if bad.size:
            self.fail(
                f"At step {bad[0] + 1} the last-position logits of the cached and the cache-free "
                f"generation differ by {err[bad[0]]:.3g} (tolerance {self.atol():g})."
            )

    @check("3.7")
    def test_call_pattern(self) -> None:
        # The forward calls are recorded in the worker, where the submission could rewrite
        # the record: they name a mistake, and only the work the grader measures (a cached
        # run must cost far less CPU time than a cache-free one) gives the points.
        problems = []
        cached = self.handout_generation(True).header.get("calls", [])
        plain = self.handout_generation(False).header.get("calls", [])
        if not cached:
            problems.append("generate never called the model's forward(tokens, start_pos).")
            problems.append(self.name_mistakes("generate_cached_calls", cached))
        else:
            first_start, first_len = cached[0]
            expect = first_start + first_len
            for start, length in cached[1:]:
                if (start, length) != (expect, 1):
                    problems.append(
                        f"With kv_caching=True, forward was called at start_pos={start} with "
                        f"{length} tokens per sequence after the prefill; each decode step must "
                        f"feed only the newest token, at start_pos={expect} (prev_pos)."
                    )
                    problems.append(self.name_mistakes("generate_cached_calls", cached))
                    # The pattern of the calls, where it singles a mistake out (isolate.py).
                    causes, line = isolate.call_causes(cached, plain, self.meta()["diagnoses"])
                    self.name(causes)
                    problems.append(line)
                    break
                expect += 1
        for i, (start, length) in enumerate(plain):
            if start != 0 or (i and length != plain[i - 1][1] + 1):
                problems.append(
                    f"With kv_caching=False, call {i + 1} was forward(tokens[:, :{length}], "
                    f"{start}); every step must feed the whole prefix from position 0."
                )
                problems.append(self.name_mistakes("generate_no_cache_calls", plain))
                break
        problems = [p for p in problems if p]
        if problems:
            self.fail("\n".join(problems))
        problem = self.cache_contents_problem()  # what the cache holds: decided, not timed
        if problem:
            self.fail(problem)
        # All in CPU time: the work ratio compares the two paths, the growth the cached path
        # with itself, the yardstick with the reference's (a cache-free path slowed on
        # purpose moves none of the last two).
        problem = self.work_problem()
        if problem:
            self.fail(f"{problem}\n{self.name_mistakes('generate_cached_calls', cached)}".strip())

    @check("3.8")
    def test_second_call_is_clean(self) -> None:
        gen = self.meta()["generate"]
        # A model built for this check alone, so earlier checks leave no trace in it.
        try:
            self.generate(gen["prompts"], True, model="fresh")
            first = self.texts(self.generate(gen["second_prompts"], True, model="fresh"))
        except SubmissionError as exc:
            cause = self.name_mistakes("second_call", {"error": exc.signature})
            self.fail(f"{with_output(exc.message, exc.output)}\n{cause}".strip())
        try:
            again: Any = self.texts(self.generate(gen["second_prompts"], True, model="fresh"))
        except SubmissionError:
            again = None
        want = self.meta()["expected_second"]
        if not first == again == want:
            observed = first if first == again else {"repeat_differs": True}
            clean = self.generate_or_fail(gen["second_prompts"], True, model="clean")
            if first == again == self.texts(clean):  # a first call on a fresh model: no state
                self.fail(
                    "A second generate call gave the same text as a first call on a fresh "
                    "model, but not the reference's text: no state is kept between calls; the "
                    "text is wrong from the start (see check 3.5). "
                    + (
                        self.generation_cause(clean, want)
                        or self.name_mistakes("second_call", observed)
                    )
                )
            self.fail(
                "After a first generate call, a second one with other prompts gave other text "
                "than on a fresh model"
                + (" and changed again when repeated" if first != again else "")
                + ": the model kept state between calls. "
                + self.name_mistakes("second_call", observed)
            )
        self.check_mode_switches(gen)

    @check("3.9")
    def test_hidden_generation(self) -> None:
        self.require_hidden()
        hidden = self.meta()["hidden_generate"]
        stop = hidden["stop"]
        runs = [
            (hidden["prompts"], {}, hidden["expected_texts"]),
            (stop["prompts"], {"max_gen_len": stop["max_gen_len"]}, stop["expected_texts"]),
        ]
        for cache in (True, False):
            for prompts, kw, want in runs:
                reply = self.generate_or_fail(
                    prompts, cache, model="hidden", record_tokens=True, **kw
                )
                if self.texts(reply) != want:
                    before = len(self.feedback.causes)
                    message = self.generation_cause(reply, want)
                    self.isolate_generation(
                        before, reply, prompts, want, cache, model="hidden", **kw
                    )
                    self.fail(
                        f"generate(kv_caching={cache}) on the hidden model gave other text. "
                        + message
                    )

    @check("3.10")
    def test_sample_top_p(self, set_score: Any = None) -> None:
        # Half the points each: sample_top_p needs no model, so it is graded even when
        # the model cannot be built.
        problems = [self.top_p_problem()]
        try:
            problems.append(self.temperature_problem(top_p_right=not problems[0]))
        except SubmissionError as exc:
            problems.append(with_output(exc.message, exc.output))
        set_score(round(points("3.10") * problems.count("") / len(problems), 4))
        if any(problems):
            self.fail("\n".join(p for p in problems if p))

    def top_p_problem(self) -> str:
        """ "" when ``sample_top_p`` draws exactly from each probe row's nucleus."""
        probs = np.array(TOP_P_PROBS, dtype=np.float32)
        header = {"op": "sample_top_p", "p": TOP_P, "draws": 400}
        try:
            reply = self.ctx.worker(self.part).request(
                header, {"probs": probs}, what=f"sample_top_p(probs, {TOP_P})"
            )
        except SubmissionError as exc:
            return with_output(exc.message, exc.output)
        draws = reply.arrays.get("draws")
        if not isinstance(draws, np.ndarray) or draws.shape != (len(probs), 400):
            return "sample_top_p(probs, p) must return one token id per row, shaped (B, 1)."
        seen = [sorted(set(row.tolist())) for row in draws]
        for row, allowed in enumerate(TOP_P_NUCLEUS):
            if seen[row] != allowed:
                before = len(self.feedback.causes)
                message = (
                    f"With probabilities {TOP_P_PROBS[row]} and p = {TOP_P}, sample_top_p must "
                    f"draw exactly from tokens {allowed}; in 400 draws it drew {seen[row]}. "
                    + self.name_mistakes("top_p", seen)
                )
                if len(self.feedback.causes) == before:  # no known mistake: p varied alone
                    self.name(isolate_sampling.top_p_causes(self))
                return message
        return ""


class Part3Benchmark(Part3CacheContents, Part3Timed):
    """Runs last: a slow generate here cannot cost the other checks their time."""

    @classmethod
    def setUpClass(cls) -> None:
        """The batches of 16 start a worker of their own: the one that graded the other
        checks holds their models (3.1's probes' caches among them), and with 3.11's
        cache-free runs on top the grading's memory would pass its budget."""
        super().setUpClass()
        cls.ctx.stop_worker(cls.part)

    def bench_criteria(
        self, bench: dict, batch: int, reference: dict[str, Timing], timings: dict[str, Timing]
    ) -> list[Criterion]:
        """The speedup of ``batch``'s cached run over its cache-free one, where the
        profile sets one for this batch size, and its time over the reference's; peak
        memory is reported, never judged."""
        clock = clock_for(self.ctx.device)
        ours = {k: t for k, t in reference.items() if k == f"batch {batch}, with the cache"}
        criteria = self.versus_reference(timings, ours, bench, clock)
        if str(batch) in bench["min_speedup"]:
            label = f"batch {batch} speedup ({clock} time)"
            ratio = self.speedup(batch, timings)
            limit = bench["min_speedup"][str(batch)]
            criteria.insert(0, Criterion(f"part3.min_speedup.{batch}", label, ratio, limit, True))
        return criteria

    def speedup(self, batch: int, timings: dict[str, Timing]) -> Ratio:
        """``batch``'s cache-free time over its cached time, on the device's clock."""
        plain = timings[f"batch {batch}, without the cache"]
        cached = timings[f"batch {batch}, with the cache"]
        return Ratio.of(plain, cached, clock_for(self.ctx.device))

    def report_unjudged_speedup(self, bench: dict, batch: int, timings: dict[str, Timing]) -> None:
        """Print ``batch``'s speedup where the profile judges none at this batch size (on a
        GPU one step at batch 1 costs about the same with the cache or without it)."""
        if str(batch) not in bench["min_speedup"]:
            clock = clock_for(self.ctx.device)
            print(
                f"batch {batch} speedup ({clock} time, not graded: the {self.ctx.device} "
                f"profile judges no speedup at this batch size): {self.speedup(batch, timings)}"
            )

    def report_peak_memory(self, bench: dict, batch: int, timings: dict[str, Timing]) -> None:
        """Print ``batch``'s peak memory, cached over cache-free, once its runs are all
        timed. Reported, never judged: at batch 1 a preallocated cache outweighs one step's
        activations, and where NVML cannot see the worker the figure is the worker's own."""
        plain = timings[f"batch {batch}, without the cache"]
        cached = timings[f"batch {batch}, with the cache"]
        limit = bench.get("max_peak_memory_ratio")
        if limit is None or not plain.peak_bytes or not cached.peak_bytes:
            return
        peaks = [[s.peak_bytes or 0 for s in t.samples] for t in (cached, plain)]
        source = memory_label([cached.peak_source, plain.peak_source], self.ctx.device)
        print(
            f"batch {batch} peak memory, cached / cache-free ({source}, not graded): "
            f"{Ratio.between(*peaks)} (the course expects at most {limit:g}x)"
        )

    @check("3.11")
    def test_benchmark(self) -> None:
        bench = load_thresholds(self.ctx.device)["part3"]
        self.require_pool(bench, bench_key(bench))
        contents = self.cache_contents_problem()  # decided before anything is timed
        if contents:
            self.fail(f"The speedup cannot count: {contents}")
        record = BenchmarkRecord(check="3.11", profile=self.ctx.device)
        reference = self.yardstick("bench")
        record.add_reference(reference)
        cached_calls: list[Any] = []  # every timed cached run's model calls
        lost = functools.partial(calls_problem, cached_calls)  # why they lose the check

        def timed_run(variants: dict[str, tuple[int, bool]], variant: str, i: int) -> Sample:
            sample = self.bench_run(bench, variants, variant, i)
            if variants[variant][1]:
                cached_calls.append(self.last_calls)
            return sample

        for batch in bench["batch_sizes"]:
            variants = {f"batch {batch}, without the cache": (batch, False),
                        f"batch {batch}, with the cache": (batch, True)}  # fmt: skip
            measured = self.measure_benchmark(
                functools.partial(timed_run, variants),
                variants,
                functools.partial(self.bench_criteria, bench, batch, reference),
                bench,
                lost,
            )
            record.add(measured)
            self.report_unjudged_speedup(bench, batch, measured.timings)
            self.report_peak_memory(bench, batch, measured.timings)
            cached = measured.timings[f"batch {batch}, with the cache"]
            record.leaderboard = {
                "tokens_per_s": batch * bench["output_len"] / cached.median,
                "speedup": self.speedup(batch, measured.timings).median,
            }
        # The timed runs' own calls name a cause whether or not a threshold was missed
        # (on a loaded machine a partial cache may miss one first): the advice says it.
        fed_again = lost()
        self.report_benchmark(
            record,
            f"Benchmark: input {bench['input_len']} tokens, output {bench['output_len']}",
            f"The speedup cannot count: {fed_again}"
            if fed_again
            else "With a working cache each decode step feeds one new token per sequence at "
            "start_pos = prev_pos and attends over the cached keys and values.",
        )
        # The speedups compare two paths of the submission's own; a cache-free path slowed
        # on purpose inflates them, so the cached path must also keep its steps' cost flat
        # and feed each token once.
        problem = fed_again or self.growth_problem() or self.cache_read_problem()
        if problem:
            self.fail(f"The speedup cannot count: {problem}")
