"""Part 4 checks: the KV-cache lab (``kv_lab.py``) on small GPT-2 models.

The models are GPT-2s of known sizes with seeded weights, built in the worker
(never downloaded). Generation is checked against the reference's tokens and
per-step logits on public prompts (the student's self-check runs them) and, on
Gradescope, hidden ones too, with the same messages; the memory functions
against exact byte counts; latency by the grader's own clock; the int8 cache (bonus) by its real
memory, its reconstruction error and the tokens it leads to.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.cases_part2 import decode_array
from grader.checks.base import (
    GradedTestCase,
    Outcome,
    ValueProblem,
    as_number,
    check,
    finite_number,
    likely_cause,
    with_output,
)
from grader.client import Reply, SubmissionError
from grader.points import BONUS, points
from grader.thresholds import load_thresholds
from grader.timing import BenchmarkRecord, Criterion, Ratio, Sample, Timing


class Part4Checks(GradedTestCase):
    part = "part4"

    # ------------------------------------------------------------- machinery

    def meta(self) -> dict[str, Any]:
        return self.ctx.cases(self.part)

    def ensure(self, name: str) -> None:
        spec = self.meta()["models"][name]
        header = {"op": "build", "model": name, **spec}
        self.once_per_worker(
            name,
            lambda: self.ctx.worker(self.part).request(header, what="building the GPT-2 model"),
        )

    def call(
        self, header: dict[str, Any], arrays: dict[str, np.ndarray], what: str, **kw: Any
    ) -> Reply:
        try:
            self.ensure(header.get("model", "lab"))
            return self.ctx.worker(self.part).request(header, arrays, what=what, **kw)
        except SubmissionError as exc:
            self.fail(with_output(exc.message, exc.output))

    def generate(self, model: str, ids: np.ndarray, n: int, cached: bool, **kw: Any) -> Reply:
        fn = "generate_with_cache" if cached else "generate_no_cache"
        header = {"op": "generate", "model": model, "n": n, "cached": cached}
        return self.call(header, {"ids": ids}, f"{fn}(model, input_ids {ids.shape}, {n})", **kw)

    def named(self, observed: dict[str, Any]) -> str:
        """ "Likely cause: ..." for the catalogued mistakes that match ``observed`` (probe ->
        what the submission did): a mistake is named when everything it is known to do
        differently on those probes is what this submission did, so the right tokens rule
        out the mistakes that change them."""
        table = self.meta().get("signatures", {})
        known = dict.fromkeys(name for probe in observed for name in table.get(probe, {}))
        names = [
            name
            for name in known
            if all(
                table[probe][name] == value
                for probe, value in observed.items()
                if name in table.get(probe, {})
            )
        ]
        return likely_cause(names, self.meta()["diagnoses"])

    def finish(self, num: str, outcome: Outcome, set_score: Any) -> None:
        set_score(round(points(num) * outcome.fraction, 4))
        print(f"{outcome.passed} of {outcome.total} cases correct.")
        if outcome.failures:
            self.fail("\n".join(outcome.failures[:3]))

    # ---------------------------------------------------------------- checks

    @check("4.1")
    def test_config_summary(self) -> None:
        """4.1 model_config_summary: layers, hidden size and heads of a model it has not seen"""
        spec = self.meta()["models"]["hidden"]["config"]
        reply = self.call(
            {"op": "call", "model": "hidden", "func": "model_config_summary", "args": ["@hidden"]},
            {},
            "model_config_summary(model)",
        )
        enc = reply.header.get("result", {})
        if enc.get("kind") != "dict":
            self.fail("model_config_summary(model) must return a dict.")
        want = {
            "n_layers": spec["n_layer"],
            "hidden_size": spec["n_embd"],
            "n_heads": spec["n_head"],
        }
        got = {k: enc["value"].get(k, {}).get("value") for k in want}
        if got != want:
            self.fail(f"model_config_summary returned {got} for a model with {want}.")

    @check("4.2", partial=True)
    def test_generation_tokens(self, set_score: Any = None) -> None:
        """4.2 cached and cache-free greedy generation give the reference tokens"""
        outcome = Outcome()
        n = self.meta()["new_tokens"]
        for case in self.cases("4.2"):
            ids = np.array(case["ids"], dtype=np.int64)
            for cached in (True, False):
                outcome.total += 1
                reply = self.generate(case["model"], ids, n, cached)
                tokens = reply.arrays.get("tokens")
                if isinstance(tokens, np.ndarray) and tokens.tolist() == case["tokens"]:
                    outcome.passed += 1
                    continue
                mode = "with" if cached else "without"
                problem = f"{case['label']}: greedy generation {mode} the cache gave other tokens."
                lengths = reply.header.get("lengths", [])
                if cached and any(x != 1 for x in lengths[1:]):
                    problem += (
                        f" forward received {lengths} tokens per call: after the prompt, each "
                        "cached step must feed only the newest token."
                    )
                outcome.failures.append(problem)
        if outcome.failures:
            outcome.failures[0] += f"\n{self.diagnose_generation()}".rstrip()
        self.finish("4.2", outcome, set_score)

    def diagnose_generation(self) -> str:
        """Run the catalogue's probe (8 tokens after ids 1..8) and name a matching mistake."""
        ids = np.arange(1, 9, dtype=np.int64)[None, :]
        try:
            reply = self.ctx.worker(self.part).request(
                {"op": "generate", "model": "lab", "n": 8, "cached": True},
                {"ids": ids},
                what="generate_with_cache(probe)",
            )
        except SubmissionError:
            return ""
        tokens = reply.arrays.get("tokens")
        return self.named({
            "cached_lengths": reply.header.get("lengths"),
            "cached_tokens": tokens.tolist() if isinstance(tokens, np.ndarray) else None,
        })  # fmt: skip

    @check("4.3", partial=True)
    def test_step_logits(self, set_score: Any = None) -> None:
        """4.3 the logits of every cached step match the reference's"""
        outcome = Outcome()
        atol = self.meta()["atol"]
        for case in self.cases("4.2"):
            outcome.total += 1
            ids = np.array(case["ids"], dtype=np.int64)
            got = self.generate(case["model"], ids, self.meta()["new_tokens"], True).arrays
            want = decode_array(case["step_logits"])
            steps = got.get("step_logits")
            if not isinstance(steps, np.ndarray) or steps.shape != want.shape:
                shape = getattr(steps, "shape", None)
                outcome.failures.append(
                    f"{case['label']}: {shape[0] if shape else 0} forward calls with logits, "
                    f"expected {want.shape[0]} (one per generated token)."
                )
                continue
            err = np.abs(steps - want).max(axis=(1, 2))
            bad = np.flatnonzero(~(err <= atol))  # NaN is never within tolerance
            if bad.size:
                outcome.failures.append(
                    f"{case['label']}: step {bad[0] + 1}'s logits differ by {err[bad[0]]:.3g}."
                )
            else:
                outcome.passed += 1
        self.finish("4.3", outcome, set_score)

    @check("4.4", partial=True)
    def test_theoretical_bytes(self, set_score: Any = None) -> None:
        """4.4 theoretical_kv_bytes = 2 · L · D · N_L · bytes on random inputs"""
        outcome = Outcome()
        for case in self.cases("4.4"):
            outcome.total += 1
            what = f"theoretical_kv_bytes{tuple(case['args'])}"
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
                outcome.failures.append(f"{what} returned {got:,}, which is wrong.")
        self.finish("4.4", outcome, set_score)

    @check("4.5")
    def test_measured_bytes(self) -> None:
        """4.5 measured_kv_bytes: the real size of the cache transformers returns"""
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

    @check("4.6", extra_tags=("benchmark",))
    def test_latency(self) -> None:
        """4.6 latency: cached ms/token stays nearly flat from L = 32 to 256, cache-free grows"""
        bench = load_thresholds(self.ctx.device)["part4"]
        ids = np.arange(1, 9, dtype=np.int64)[None, :]
        lo, hi = bench["L_values"]
        variants = {
            f"{'with' if cached else 'without'} the cache, L = {L}": (cached, L)
            for cached in (True, False)
            for L in (lo, hi)
        }

        first: dict[int, list] = {}  # L -> the tokens every timed run of that L must give

        def timed_run(variant: str, i: int) -> Sample:
            cached, L = variants[variant]
            reply = self.generate(
                "lab", ids, L, cached, timeout=max(self.ctx.limits.request_timeout_s, 60.0),
                key=f"timed generation {cached} {L}", timed=True,
            )  # fmt: skip
            tokens = reply.arrays.get("tokens")
            got = tokens.tolist() if isinstance(tokens, np.ndarray) else None
            expected = first.setdefault(L, got)
            if got is None or np.shape(got) != (1, ids.shape[1] + L) or got != expected:
                self.fail(
                    f"The timed generation ({variant}) did not return {ids.shape[1] + L} greedy "
                    "tokens equal to those of the other mode, so its time cannot count."
                )
            return Sample(reply.seconds, reply.peak_bytes)

        def growth(timings: dict[str, Timing], cached: bool) -> Ratio:
            name = "with" if cached else "without"
            short, long = (timings[f"{name} the cache, L = {L}"] for L in (lo, hi))
            return Ratio.between([t / hi for t in long.seconds], [t / lo for t in short.seconds])

        def judge(timings: dict[str, Timing]) -> list[Criterion]:
            return [
                Criterion(
                    "part4.max_cached_growth",
                    f"cached ms/token, L = {hi} over L = {lo}",
                    growth(timings, True),
                    bench["max_cached_growth"],
                    False,
                ),
                Criterion(
                    "part4.min_no_cache_growth",
                    f"cache-free ms/token, L = {hi} over L = {lo}",
                    growth(timings, False),
                    bench["min_no_cache_growth"],
                    True,
                ),
            ]

        record = BenchmarkRecord(check="4.6", profile=self.ctx.device)
        record.add(self.measure_benchmark(timed_run, variants, judge, bench))
        self.report_benchmark(
            record,
            f"Latency per generated token at L = {lo} and {hi}",
            "With the cache every step after the prompt feeds one token, so its cost hardly "
            "depends on how many came before; without it every step re-reads the whole sequence."
            + (f"\n{cause}" if not record.passed and (cause := self.diagnose_generation()) else ""),
        )

    @check("4.7", partial=True, bonus=True)
    def test_int8_bonus(self, set_score: Any = None) -> None:
        """4.7 bonus: an int8 KV cache (memory, reconstruction error, greedy agreement)"""
        ids = np.arange(3, 67, dtype=np.int64)[None, :] % 500
        reply = self.call(
            {"op": "int8", "model": "lab", "n": 64},
            {"ids": ids},
            "quantize_kv_int8 / dequantize_kv_int8",
        )
        r = reply.header
        for key in ("q_bytes", "fp16_bytes", "max_rel_error", "agree"):
            if not finite_number(r.get(key)):
                set_score(0)
                self.fail(f"The int8 report's {key} is not a finite number ({r.get(key)!r}).")
        ratio = r["q_bytes"] / max(r["fp16_bytes"], 1)
        print(
            f"int8 cache: {r['q_bytes']:,} bytes = {ratio:.2f} x the fp16 cache; max relative "
            f"error {r['max_rel_error']:.2%}; greedy agreement {r['agree']:.0%} of 64 tokens"
        )
        problems = []
        if "torch.uint8" in r["dtypes"] and "torch.int8" not in r["dtypes"]:
            problems.append(
                "The cache is a bare uint8 cast: negative keys and values wrap around and "
                "there is no scale. " + self.named({"int8_dtypes": r["dtypes"]})
            )
        # Written so that every condition fails for NaN.
        if not ratio <= 0.55:
            problems.append(f"It uses {ratio:.2f} x the fp16 cache's memory (at most 0.55).")
        if not r["max_rel_error"] <= 0.02:
            problems.append(
                f"Its max relative reconstruction error is {r['max_rel_error']:.2%} (at most 2%)."
            )
        if not r["agree"] >= 0.9:
            problems.append(f"Greedy tokens agree on {r['agree']:.0%} of 64 (at least 90%).")
        if problems:
            set_score(0)
            self.fail("\n".join(problems))
        set_score(BONUS["4.7"])
