"""Part 4's latency runs, a base class of the checks: check 4.6's timed generations and
yardstick, and check 4.8's probes of ``measure_latency`` (its exact cases on the driven
clock, its run counts), kept apart so that checks.py holds the checks themselves."""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.checks.base import Workload
from grader.checks.calls import fed_once, shown
from grader.core.thresholds import load_thresholds
from grader.parts.part4.latency import RUN_COUNT_CASE, latency_figures, run_count_problem
from grader.parts.part4.latency_clock import CLOCKED_CASES, clocked_problem
from grader.parts.part4.support import Part4Base, plain_value
from grader.runtime.timing import Sample, round_length


class Part4LatencyRuns(Part4Base):
    """The timed generations and ``measure_latency`` probes the latency checks ask for."""

    def latency_run(
        self, model: str, case: dict[str, Any], cached: bool, L: int
    ) -> tuple[Sample, Any]:
        """One timed generation of ``L`` tokens after ``case``'s prompt: its time per token
        and the reply. Its tokens must be the reference's, or its time cannot count."""
        self.ensure(model)
        ids = np.array(case["ids"], dtype=np.int64)
        reply = self.generate(
            model, ids, L, cached, timeout=max(self.ctx.limits.request_timeout_s, 60.0),
            key=f"timed generation {cached} {L}", timed=True, tokens_only=True,
        )  # fmt: skip
        tokens = reply.arrays.get("tokens")
        want = [row[: ids.shape[1] + L] for row in case["tokens"]]
        if not isinstance(tokens, np.ndarray) or tokens.tolist() != want:
            fn = "generate_with_cache" if cached else "generate_no_cache"
            with_or = "with" if cached else "without"
            self.fail(
                f"The timed generation {with_or} the cache, L = {L} ({fn}, {case['label']}) "
                f"did not return the reference's {ids.shape[1] + L} greedy tokens, so its time "
                f"cannot count. Check 4.2 compares {fn} with the reference on other prompts."
            )
        return reply.sample(per=L), reply

    def yardstick_workloads(self) -> dict[str, Workload]:
        """The reference's cached runs at the longest L of check 4.6, on its prompts."""
        bench = load_thresholds(self.ctx.device)["part4"]
        model = "bench" if "model" in bench else "lab"
        pool, L = self.timed_prompts(), bench["L_values"][-1]

        def run(_: str, i: int) -> Sample:
            length = round_length(L, bench, i)  # a warm-up round's is shorter
            return self.latency_run(model, pool[i % len(pool)], True, length)[0]

        return {"latency": (run, [f"with the cache, L = {L}"], bench)} if pool else {}

    def run_counts(self) -> None:
        """warmup + repeats runs of each generate function per L, with the values passed:
        told from the calls themselves, however the generate functions work. Run after
        the grader's clock saw the first model call's delay outside the timed runs: the
        lab warmed up, so ``repeats`` timed runs after a warm-up of its own (model passes,
        as the course's lab leaves the warm-up open) are accepted too."""
        case = RUN_COUNT_CASE
        what = f"measure_latency(model, {tuple(case['L_values'])}, ...)"
        reply = self.call({"op": "latency_runs", "model": "lab", **case}, {}, what)
        problem = run_count_problem(reply.header.get("calls"), case, own_warmup=True)
        if problem:
            self.fail(problem)
        if problem is None:
            print(
                "measure_latency called neither generate function by its name, so how often "
                "it runs them is not checked."
            )

    def clocked_cases(self) -> None:
        """4.8's exact cases: measure_latency on the adapter's driven clock, with every
        argument passed, then with the handout's defaults. A warm-up of the lab's own in
        place of the ``warmup`` runs is accepted (see :meth:`run_counts`); at the
        defaults only from a lab that ignored the ``warmup`` passed to it too (one that
        ran the runs passed and none at its defaults has a default warmup of 0)."""
        problems: list[str] = []
        own = True  # the grader's clock saw a warm-up outside the timed runs
        for case in CLOCKED_CASES:
            reply = self.call(case.request(), {}, case.what)
            result = plain_value(reply.header.get("result"))
            got, problem = latency_figures(result, list(case.L_values))
            name = None
            if not problem:  # the defaults are suspect once the case passing them all is right
                suspect = not case.args and problems == [""]
                problem, name = clocked_problem(case, got, defaults_only=suspect, own_warmup=own)
                own = own and not problem and bool(clocked_problem(case, got)[0])
            problems.append(f"{problem}\n{self.cause([name] if name else [])}".strip())
        if any(problems):
            self.fail("\n".join(p for p in problems if p))
        print(f"Exact on the grader's own clock: {'; '.join(c.what for c in CLOCKED_CASES)}.")


def calls_problem(runs: list[tuple[int, int, list[int]]]) -> str:
    """Why a timed ``generate_with_cache`` run's model calls were not the prompt once and
    then one token per call ("" when they were; see :mod:`grader.checks.calls`)."""
    for L, prompt_len, lengths in runs:
        calls_ok = len(lengths) - 1 <= L and sum(lengths) >= prompt_len + L - 1
        if not (calls_ok and fed_once(lengths, prompt_len)):
            return (
                f"a timed generate_with_cache(model, input_ids, {L}) called the model with "
                f"{shown(lengths)} tokens per call for a {prompt_len}-token prompt. With the "
                "cache, the prompt goes through the model once, then each new token alone "
                f"({L} calls, {prompt_len + L - 1} tokens in all); feeding more (rebuilding "
                "the cache every few tokens, or the last few tokens again) recomputes part of "
                "the work."
            )
    return ""
