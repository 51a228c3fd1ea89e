"""Part 4's latency runs, a base class of the checks: check 4.6's timed generations and
yardstick, and check 4.8's timed cases of ``measure_latency`` (its figures against the
grader's own measurement of the generations it ran), kept apart so that checks.py holds
the checks themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.core.thresholds import load_thresholds
from grader.judging.base import Workload
from grader.judging.calls import fed_once, shown
from grader.parts.part4.latency import latency_figures
from grader.parts.part4.latency_clock import (
    CLOCKED_CASES,
    ClockedCase,
    generations_of,
    timed_problem,
)
from grader.parts.part4.latency_isolate import EXPERIMENTS, Run, latency_causes, runs_table
from grader.parts.part4.support import Part4Base, plain_value
from grader.runtime.outcomes import SubmissionError
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
        if reply.header.get("grad_recorded") is True:
            self.fail(autograd_problem(cached, L, self.cause(["generation_with_autograd"])))
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

    def clocked_cases(self) -> None:
        """4.8's timed cases: measure_latency with every argument passed, then with the
        handout's defaults, each figure judged against the grader's own measurement of
        the generations it ran (:mod:`grader.parts.part4.latency_clock`). Where the grader
        finds no generation (measure_latency reaches neither generate function by its
        name, and its model calls are not the handout's), nothing can be judged."""
        problems: list[str] = []
        unseen: list[str] = []
        named: list[str] = []
        read: list[tuple[int, ClockedCase, dict, list, bool]] = []  # judged on the record
        for case in CLOCKED_CASES:
            timeout = max(self.ctx.limits.request_timeout_s, 60.0)
            reply = self.call(case.request(), {}, case.what, timeout=timeout)
            result = plain_value(reply.header.get("result"))
            got, problem = latency_figures(result, list(case.L_values))
            name = None
            if not problem:
                gens, problem = generations_of(reply.header, case.settings["prompt_len"])
                if not problem and not gens:
                    unseen.append(case.what)
                elif not problem:  # the defaults are suspect once the case passing all is right
                    suspect = not case.args and problems == [""]
                    problem, name = timed_problem(case, got, gens, defaults_only=suspect)
                    read.append((len(problems), case, got, gens, suspect))
            named += [name] if name else []
            problems.append(f"{problem}\n{self.cause([name] if name else [])}".strip())
        if any(problems):
            if not named:  # the library's names give the most precise words
                causes, line = self.isolate_latency()
                for i, case, got, gens, suspect in read if causes else ():
                    # what one call's figures happen to equal gives way to the isolation's
                    problems[i] = timed_problem(case, got, gens, suspect, say_match=False)[0]
                problems.append(line)
            self.fail("\n".join(p for p in problems if p))
        if unseen:
            print(
                f"{'; '.join(unseen)}: the grader found none of its generations (it calls "
                "neither generate function by its name, and its model calls are not the "
                "handout's: see 4.2 and 4.3), so its figures are judged by the grader's "
                "clock around the call alone."
            )
        judged = [c.what for c in CLOCKED_CASES if c.what not in unseen]
        if judged:
            print(f"Timed by the grader, generation by generation: {'; '.join(judged)}.")

    def isolate_latency(self) -> tuple[list[Cause], str]:
        """Name what the isolating calls of :mod:`grader.parts.part4.latency_isolate`
        single out (``measure_latency`` again with warmup varied alone and repeats varied
        alone) for a 4.8 that failed without a catalogued cause. Returns the causes named
        and a line saying how many generations each call made ("" where none could be
        read)."""
        runs = self.isolating_runs()
        if not runs:
            return [], ""
        causes = latency_causes(runs)
        self.name(causes)
        return causes, runs_line(runs, causes)

    def share_cause(self, mistake: str | None) -> str:
        """What 4.8 says after its first probe (the figures against the grader's clock
        around the call) failed with ``mistake`` (of :meth:`LatencyVerdict.mistake`).
        A timed first run (``latency_no_warmup``) and a clock started once before the
        warm-ups give the same figures there, the one-off delay in both: the isolating
        calls decide, and the library's name stands unless they single out the clock's
        start. No mistake: the isolation's words, or none."""
        if mistake is None:
            return self.isolate_latency()[1]
        if mistake == "latency_no_warmup":
            runs = self.isolating_runs()
            causes = latency_causes(runs) if runs else []
            if causes and {c.id for c in causes} <= STARTED_ONCE:
                self.name(causes)
                return runs_line(runs, causes)
        return self.cause([mistake])

    def isolating_runs(self) -> dict[str, Run]:
        """The isolating calls that returned figures and a record that can be read."""
        runs: dict[str, Run] = {}
        for case in EXPERIMENTS:
            timeout = max(self.ctx.limits.request_timeout_s, 60.0)
            try:
                reply = self.call(case.request(), {}, case.what, soft=True, timeout=timeout)
            except SubmissionError:
                continue  # a call that fails tells nothing of the others
            got, problem = latency_figures(plain_value(reply.header.get("result")),
                                           list(case.L_values))  # fmt: skip
            gens, unread = ([], problem) if problem else generations_of(
                reply.header, case.settings["prompt_len"])  # fmt: skip
            if gens and not unread:
                runs[case.what] = Run(case, got, gens)
        return runs


#: The isolated causes of a clock started once, which can pass for a timed first run.
STARTED_ONCE = {
    "isolated:latency_clock_started_once",
    "isolated:latency_clock_started_before_warmups",
}


def runs_line(runs: dict[str, Run], causes: Sequence[Cause] = ()) -> str:
    """How many generations each isolating call made, then the evidence of each cause
    whose sentence does not hold it already."""
    lines = [f"Generations measure_latency made, by the grader's record: {runs_table(runs)}."]
    lines += [f"Narrowed by experiment: {c.evidence}." for c in causes
              if c.evidence and c.evidence not in c.text]  # fmt: skip
    return "\n".join(lines)


def calls_problem(runs: list[tuple[int, int, list[int]]]) -> str:
    """Why a timed ``generate_with_cache`` run's model calls were not the prompt once and
    then one token per call ("" when they were; see :mod:`grader.judging.calls`)."""
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


def autograd_problem(cached: bool, L: int, cause: str) -> str:
    """Why a timed run whose model calls built autograd's graph cannot count: the grader
    calls the generate functions as a script would, so the graph is the lab's own, and
    what it costs is a behaviour of the lab, not of the grader."""
    fn = "generate_with_cache" if cached else "generate_no_cache"
    return (
        f"The timed generation {'with' if cached else 'without'} the cache, L = {L} ({fn}) "
        "ran the model with autograd on: the logits it returned carry a gradient history "
        "(requires_grad). The grader calls your generate functions as your own script would, "
        "under no context of its own, so this time would include autograd's bookkeeping: with "
        "the cache every step's graph stays alive through the cached keys and values, so a "
        "step costs more the longer the sequence (on the CPU profile about 1.9x the "
        "reference's at L = 256) and memory grows beyond the cache itself. Generate under "
        "torch.no_grad() (the provided @torch.no_grad() decorators), as the course's lab "
        f"does.\n{cause}"
    ).strip()
