"""Part 4 checks: the KV-cache lab (``kv_lab.py``) on small GPT-2 models.

The models are GPT-2s of known sizes with seeded weights, built in the worker
(never downloaded). Generation is checked against the reference's tokens and
per-step logits on public prompts (the student's self-check runs them) and, on
Gradescope, hidden ones too, with the same messages; the memory functions
against exact byte counts (the defaults included); latency by the grader's own clock
(CPU time of the worker on a CPU, wall time on a GPU); ``measure_latency``'s figures
against the grader's clock around the call and against the grader's own timing of
every generation it ran (with every argument passed and with the handout's defaults);
the int8 cache (bonus) from the tensors it holds, judged here against the reference
cache stored with the cases (format, memory, reconstruction error, and the tokens it
leads to) and on a float16 cache with all-zero vectors that the grader made up.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from grader.core.arrays import decode_array
from grader.core.feedback_items import Case
from grader.core.points import BONUS, points
from grader.core.thresholds import load_thresholds
from grader.judging.base import (
    Outcome,
    ValueProblem,
    as_number,
    check,
    shown,
)
from grader.parts.part4.int8 import int8_reply, judge_int8, judge_int8_cache, restored_dtypes
from grader.parts.part4.latency import judge_latency, latency_criteria, latency_figures
from grader.parts.part4.latency_runs import Part4LatencyRuns, calls_problem
from grader.parts.part4.support import (
    WrongValue,
    generation_problem,
    plain_value,
    summarise_wrong_values,
)
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import (
    BenchmarkRecord,
    Criterion,
    Sample,
    Timing,
    clock_for,
    round_length,
)

DISTILGPT2 = {"n_layers": 6, "hidden_size": 768, "n_heads": 12, "vocab_size": 50257,
              "n_positions": 1024}  # fmt: skip
CONFIG_KEYS = {"n_layers": "n_layer", "hidden_size": "n_embd", "n_heads": "n_head",
               "vocab_size": "vocab_size", "n_positions": "n_positions"}  # fmt: skip


class Part4Checks(Part4LatencyRuns):
    """The checks of Part 4, in their handout order."""

    # ---------------------------------------------------------------- checks

    @check("4.1")
    def test_config_summary(self) -> None:
        problems, hard_coded = [], False
        for name in ("lab", "hidden"):
            spec = self.meta()["models"][name]["config"]
            reply = self.call(
                {"op": "call", "model": name, "func": "model_config_summary", "args": [f"@{name}"]},
                {},
                "model_config_summary(model)",
            )
            enc = reply.header.get("result", {})
            if enc.get("kind") != "dict":
                self.fail("model_config_summary(model) must return a dict.")
            want = {key: spec[field] for key, field in CONFIG_KEYS.items()}
            got = {}
            for key in want:
                item = enc["value"].get(key)
                got[key] = item.get("value") if isinstance(item, dict) else None
                if isinstance(item, dict) and item.get("kind") != "int":
                    got[key] = f"{shown(got[key])} ({str(item.get('kind'))[:40]}, not an int)"
            wrong = [key for key in want if got[key] != want[key]]
            if wrong:
                problems.append(
                    f"For a GPT-2 with {want}, model_config_summary returned "
                    + ", ".join(f"{key}={got[key]}" for key in wrong)
                    + "."
                )
                hard_coded |= any(got[key] == DISTILGPT2[key] for key in wrong)
        if problems:
            if hard_coded:
                problems.append(self.cause(["config_hardcoded"]))
            self.fail("\n".join(problems))

    @check("4.2")
    def test_generation_tokens(self, set_score: Any = None) -> None:
        outcome = Outcome()
        n = self.meta()["new_tokens"]
        for case in self.cases("4.2"):
            prefix = int(case.get("cached_prefix", 0))
            for cached in (True,) if prefix else (True, False):
                reply, tokens = self.generated(outcome, case, case["label"], n, cached, prefix)
                if reply is None:
                    continue
                if tokens == case["tokens"]:
                    outcome.passed += 1
                    continue
                lengths = reply.header.get("lengths", [])
                outcome.failures.append(
                    generation_problem(case, cached, prefix, lengths, self.cause)
                )
        self.zero_new_tokens(outcome)
        if outcome.failures:
            self.diagnose_generation()  # names the mistake in the feedback
        self.finish("4.2", outcome, set_score)

    def generated(
        self,
        outcome: Outcome,
        case: dict[str, Any],
        label: str,
        n: int,
        cached: bool,
        prefix: int = 0,
    ) -> tuple[Any, list | None]:
        """One generation of ``case``, counted in ``outcome``: the reply and its tokens as
        a list (None when not an array). A generation that fails is recorded as a failure
        under ``label``, and its reply is None; the caller counts a pass."""
        outcome.total += 1
        try:
            self.ensure(case["model"])
            ids = np.array(case["ids"], dtype=np.int64)
            reply = self.generate(case["model"], ids, n, cached, prefix, soft=True)
        except SubmissionError as exc:
            outcome.failures.append(Case(label, exc.message))
            return None, None
        tokens = reply.arrays.get("tokens")
        return reply, tokens.tolist() if isinstance(tokens, np.ndarray) else None

    def zero_new_tokens(self, outcome: Outcome) -> None:
        """L = 0 gives the prompt back, in both modes: the token the prefill picks is the
        first of the L new tokens, never one more."""
        case = self.cases("4.2")[0]
        ids = np.array(case["ids"], dtype=np.int64)
        for cached in (True, False):
            fn = "generate_with_cache" if cached else "generate_no_cache"
            reply, tokens = self.generated(outcome, case, f"{case['label']}, L = 0", 0, cached)
            if reply is None:
                continue
            if tokens == case["ids"]:
                outcome.passed += 1
                continue
            got = reply.arrays.get("tokens")
            shape = tuple(got.shape) if isinstance(got, np.ndarray) else None
            problem = (
                f"{fn}(model, input_ids {tuple(ids.shape)}, 0) returned "
                + (f"shape {shape}" if shape else "something else")
                + " instead of the prompt unchanged."
            )
            if shape == (ids.shape[0], ids.shape[1] + 1):
                problem += (
                    " That is one token more than asked for: the token the prefill picks "
                    "is the first of the L new tokens, so with L = 0 no token is added."
                )
            outcome.failures.append(problem)

    @check("4.3")
    def test_step_logits(self, set_score: Any = None) -> None:
        outcome = Outcome()
        atol = self.meta()["atol"]
        for case in self.cases("4.2"):
            if case.get("cached_prefix"):
                continue  # 4.2 checks the continuation's tokens
            outcome.total += 1
            ids = np.array(case["ids"], dtype=np.int64)
            got = self.generate(case["model"], ids, self.meta()["new_tokens"], True).arrays
            want = decode_array(case["step_logits"])
            steps = got.get("step_logits")
            if not isinstance(steps, np.ndarray) or steps.shape != want.shape:
                shape = getattr(steps, "shape", None)
                outcome.failures.append(
                    Case(
                        case["label"],
                        f"{shape[0] if shape else 0} forward calls with logits, expected "
                        f"{want.shape[0]} (one per generated token).",
                    )
                )
                continue
            err = np.abs(steps - want).max(axis=(1, 2))
            bad = np.flatnonzero(~(err <= atol))  # NaN is never within tolerance
            if bad.size:
                what = f"step {bad[0] + 1}'s logits differ by {err[bad[0]]:.3g}."
                outcome.failures.append(Case(case["label"], what))
            else:
                outcome.passed += 1
        self.finish("4.3", outcome, set_score)

    @check("4.4")
    def test_theoretical_bytes(self, set_score: Any = None) -> None:
        outcome = Outcome()
        wrong: list[WrongValue] = []
        for case in self.cases("4.4"):
            outcome.total += 1
            what = f"theoretical_kv_bytes{tuple(case['args'])}" + (
                " (bytes_per_elem left at its default)" if len(case["args"]) == 3 else ""
            )
            reply = self.call(
                {"op": "call", "func": "theoretical_kv_bytes", "args": case["args"]}, {}, what
            )
            try:
                got = as_number(reply.header.get("result"), "int", what)
            except ValueProblem as exc:
                outcome.failures.append(str(exc))
                continue
            if got == case["expected"]:
                outcome.passed += 1
            else:
                wrong.append(WrongValue(what, got, case.get("mistakes", {})))
        lines, names = summarise_wrong_values(wrong, outcome.total)
        outcome.failures += lines
        set_score(round(points("4.4") * outcome.fraction, 4))
        self.say_count(outcome.passed, outcome.total)
        if outcome.failures:
            self.cause(names)
            self.fail_with(outcome.listing())

    @check("4.5")
    def test_measured_bytes(self) -> None:
        problems = []
        for model, batch, length, dtype, size in (
            ("lab", 2, 10, "float32", 4),
            ("lab", 1, 33, "float16", 2),
            ("hidden", 3, 7, "float32", 4),
        ):
            cfg = self.meta()["models"][model]["config"]
            want = 2 * cfg["n_layer"] * batch * length * cfg["n_embd"] * size
            ids = np.arange(batch * length, dtype=np.int64).reshape(batch, length) % 100
            what = f"measured_kv_bytes(cache of {batch}x{length} tokens, {dtype})"
            reply = self.call(
                {"op": "measured_bytes", "model": model, "dtype": dtype}, {"ids": ids}, what
            )
            try:
                got = as_number(reply.header.get("result"), "int", what)
            except ValueProblem as exc:
                problems.append(str(exc))
                continue
            if got != want:
                problems.append(f"{what} returned {got:,}; the cache holds {want:,} bytes.")
        if problems:
            self.fail("\n".join(problems))

    @check("4.6")
    def test_latency(self) -> None:
        bench = load_thresholds(self.ctx.device)["part4"]
        clock = clock_for(self.ctx.device)
        lo, hi = bench["L_values"]
        model = "bench" if "model" in bench else "lab"  # a GPU workload's model, or the lab's
        pool = self.timed_prompts()
        if not pool:
            self.fail("The grader's latency prompts are missing from its test cases.")
        variants = {
            f"{'with' if cached else 'without'} the cache, L = {L}": (cached, L)
            for cached in (True, False)
            for L in (lo, hi)
        }
        taken = [0]  # every timed run, of every mode and L, gets the next prompt of its own
        cached_calls: list[tuple[int, int, list[int]]] = []  # (L, prompt, model call lengths)

        def timed_run(variant: str, i: int) -> Sample:
            cached, L = variants[variant]
            L = round_length(L, bench, i)  # a warm-up round's is shorter
            case = pool[taken[0] % len(pool)]  # (the pool holds one per run of a grading)
            taken[0] += 1
            sample, reply = self.latency_run(model, case, cached, L)
            if cached and isinstance(reply.header.get("lengths"), list):
                cached_calls.append((L, len(case["ids"][0]), reply.header["lengths"]))
            return sample

        reference = self.yardstick("latency")

        def judge(timings: dict[str, Timing]) -> list[Criterion]:
            return [
                *latency_criteria(timings, bench, clock),
                *self.versus_reference(timings, reference, bench, clock),
            ]

        record = BenchmarkRecord(check="4.6", profile=self.ctx.device)
        lost = functools.partial(calls_problem, cached_calls)  # why the runs lose the check
        record.add(self.measure_benchmark(timed_run, variants, judge, bench, lost))
        record.add_reference(reference)
        measured = "the worker's CPU time" if clock == "cpu" else "wall time"
        # The timed runs' own calls name a cause whether or not a threshold was missed
        # (on a loaded machine a partial cache may miss one first): the advice says it,
        # with the known mistake the catalogue's probe matches (a cache-free path feeds
        # the whole sequence at every call, which the calls alone cannot tell apart from
        # a cache asked for and never passed back).
        fed_again = lost()
        advice = (
            f"The timing cannot count: {fed_again}"
            if fed_again
            else "With the cache every step after the prompt feeds one token, so its cost "
            "hardly depends on how many came before; without it every step re-reads the whole "
            "sequence."
        )
        if (fed_again or not record.passed) and (cause := self.diagnose_generation()):
            advice += f"\n{cause}"
        self.report_benchmark(
            record, f"Time per generated token at L = {lo} and {hi} (ratios of {measured})", advice
        )
        if fed_again:
            self.fail(advice)

    @check("4.7")
    def test_int8_bonus(self, set_score: Any = None) -> None:
        [case] = [c for c in self.cases("4.7") if "tokens" in c]
        ids = np.array(case["ids"], dtype=np.int64)
        expected = np.array(case["tokens"], dtype=np.int64)
        reply = self.call(
            {"op": "int8", "model": "lab", "n": expected.shape[1]},
            {"ids": ids},
            "quantize_kv_int8 / dequantize_kv_int8 / quantized_kv_bytes",
        )
        originals = [decode_array(t) for t in case["cache"]]
        v = judge_int8(originals, *int8_reply(reply.header, reply.arrays, originals), expected)
        print(
            f"int8 cache (measured by the grader): {v.q_bytes:,} bytes = {v.ratio:.2f} x the "
            f"fp16 cache; max relative error {v.max_error:.2%}; greedy agreement "
            f"{v.agreement:.0%} of {expected.shape[1]} tokens"
        )
        [edge] = [c for c in self.cases("4.7") if "dtype" in c]
        cache = [decode_array(t).astype(edge["dtype"]) for t in edge["cache"]]
        reply = self.call(
            {"op": "int8_cache", "layers": len(cache) // 2},
            {f"{'kv'[i % 2]}{i // 2}": x for i, x in enumerate(cache)},
            f"the int8 round trip of {edge['label']}",
        )
        q_arrays, q_dtypes, reported, restored, _ = int8_reply(reply.header, reply.arrays, cache)
        e = judge_int8_cache(
            cache, q_arrays, q_dtypes, reported, restored, restored_dtypes(reply.header)
        )
        print(f"{edge['label']}: {'as the handout asks' if e.passed else 'wrong, see below'}")
        if not (v.passed and e.passed):
            set_score(0)
            failures = [*v.failures(expected.shape[1]), *e.failures(0)]
            failures = list(dict.fromkeys(failures))  # both probes may say the same thing
            self.fail("\n".join([*failures, self.cause([*v.mistakes, *e.mistakes])]).strip())
        set_score(BONUS["4.7"])

    @check("4.8")
    def test_measure_latency(self) -> None:
        L_values, repeats = [8, 24], 1
        ids = np.arange(1, 9, dtype=np.int64)[None, :]
        try:  # one run of every generation, by the grader's clock: what sizes the delay
            runs = {
                (cached, L): self.generate("lab", ids, L, cached, soft=True)
                for cached in (True, False)
                for L in L_values
            }
        except SubmissionError as exc:
            self.fail(f"measure_latency times your generate functions, which must run: {exc}")
        delay = round(min(max(8 * sum(r.seconds for r in runs.values()), 0.5), 6.0), 3)
        what = (
            f"measure_latency(model, {tuple(L_values)}, prompt_len=8, warmup=1, repeats={repeats})"
        )
        reply = self.call(
            {"op": "latency", "model": "lab", "L_values": L_values, "prompt_len": 8,
             "warmup": 1, "repeats": repeats, "first_call_delay_s": delay},
            {}, what, timeout=max(self.ctx.limits.request_timeout_s, 60.0 + delay),
        )  # fmt: skip
        figures, problem = latency_figures(plain_value(reply.header.get("result")), L_values)
        if problem:
            self.fail(problem)
        verdict, totals_share = judge_latency(figures, L_values, repeats, reply.seconds, delay)
        print(verdict.summary(what, figures))
        if not verdict.passed:
            mistake = verdict.mistake(totals_share)
            more = self.share_cause(mistake)
            self.fail(f"{verdict.explain(what, figures)}\n{more}".strip())
        self.clocked_cases()
