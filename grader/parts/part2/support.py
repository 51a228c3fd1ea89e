"""What the Part 2 checks share: building the model in the worker, running
forward plans, comparing logits and naming known mistakes.

The student's model is built in the worker with weights the grader draws from
a seeded generator (the same values students get as ``model_state_dict.pt``);
every logit comes back as a float32 array and is compared here with the
reference's, with one absolute tolerance. ``generate`` is checked for what it
does (same tokens with and without the cache, one new token per cached call,
temperature honoured), and its speed is timed by the grader itself.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from grader.core.arrays import decode_array, weights_digest
from grader.core.feedback_items import Case, LogitCase
from grader.core.points import points
from grader.core.thresholds import load_thresholds
from grader.judging.base import (
    Failure,
    GradedTestCase,
    Outcome,
    likely_cause,
    with_output,
)
from grader.judging.logits import (
    compare,
    logits_problem,
    matching_mistakes,
    position,
)
from grader.judging.timed_pools import build_pool
from grader.parts.part2 import live_pools
from grader.parts.part2.cases import (
    WORK_POSITIONS,
    ablate,
    bench_model,
    load_header,
    make_state_dict,
    pool_key,
)
from grader.parts.part2.diagnosis import Part2Diagnosis
from grader.runtime.outcomes import Reply, SubmissionError
from grader.runtime.timing import Sample

FATAL = {"missing", "import", "timeout", "crash", "load"}


def plan(steps: list[int] | None) -> str:
    """A forward plan in words, for messages."""
    if steps is None:
        return "without the cache"
    if len(steps) == 1:
        return "with the cache, one call"
    if all(n == 1 for n in steps):
        return "with the cache, one token per call"
    return f"with the cache, {len(steps)} calls of {steps[0]}, then {steps[1]} tokens"


def checked_weights(spec: dict[str, Any], name: str) -> dict[str, np.ndarray]:
    """The weights of model ``spec``, checked against their stored digest where it has one."""
    weights = make_state_dict(spec)
    if "weights_sha256" in spec and weights_digest(weights) != spec["weights_sha256"]:
        raise RuntimeError(f"grader fault: the {name} model's weights do not match their digest")
    return weights


class CaseFailure(Exception):
    """One case failed (``failure``: the case, or a plain line); ``kind`` says whether
    later cases are worth running."""

    def __init__(self, failure: Failure, kind: str = "value") -> None:
        super().__init__(failure if isinstance(failure, str) else failure.sentence())
        self.failure = failure
        self.kind = kind


class Part2Base(Part2Diagnosis, GradedTestCase):
    """Machinery of the Part 2 checks (no checks of its own)."""

    part = "part2"

    @classmethod
    def setUpClass(cls) -> None:
        """A benchmark model of the profile's own (a GPU workload) has its prompt pool built
        by the reference now, before the submission's worker first starts."""
        super().setUpClass()
        bench = load_thresholds(cls.ctx.device)["part2"]
        if "model" in bench:
            cases = cls.ctx.cases("part2")
            key = pool_key(bench["prompt_len"], bench["new_tokens"], bench["model"])
            if key not in cases.get("bench_pools", {}):
                public = cases["models"]["public"]
                build = functools.partial(live_pools.live_pool, cls.ctx, public, bench)
                build_pool(cls.ctx, "part2", key, build)

    # ------------------------------------------------------------------ data

    def meta(self) -> dict[str, Any]:
        return self.ctx.cases(self.part)

    def atol(self) -> float:
        return float(self.meta()["atol"])

    def course_cases(self) -> list[dict[str, Any]]:
        """The public ``test_cases.json`` (the students' file), as arrays."""
        key = "part2.course_cases"
        if key not in self.ctx.scratch:
            path = self.ctx.cases_root / "public" / self.meta()["course_cases"]
            self.ctx.scratch[key] = [
                {
                    k: np.array(v, dtype=np.int64 if k == "input_ids" else np.float32)
                    for k, v in c.items()
                }
                for c in json.loads(path.read_text())
            ]
        return self.ctx.scratch[key]

    # --------------------------------------------------------------- worker

    def ensure_model(self, name: str, *, full: bool = False) -> None:
        """Build model ``name`` in the worker (again after a restart).

        A failure is remembered: check 2.1 (``full``) shows it whole, every later
        check refers to it in one line. Only check 2.11 builds the benchmark's model
        (the public sizes with more positions), so it shows that model's failure whole.
        """
        not_run = (
            f"Not run: DecoderOnlyTransformer could not be built with the {name} model's "
            "weights (see check 2.1 for why)."
        )
        if name == "hidden":
            not_run = (
                "Not run: DecoderOnlyTransformer could not be built with the hidden model's "
                "weights, whose sizes differ from the public model's: read every size from "
                "the constructor's arguments."
            )
        full = full or name in ("bench", "work")
        self.build_once(name, lambda: self._load(name), not_run, full=full)

    def model_spec(self, name: str) -> dict[str, Any]:
        """Config and seed of model ``name``: stored in the cases, except the benchmark's,
        which has room for the benchmark's prompt and new tokens (thresholds file)."""
        if name == "bench":
            bench = load_thresholds(self.ctx.device)["part2"]
            positions = bench["prompt_len"] + bench["new_tokens"]
            return bench_model(self.meta()["models"]["public"], positions, bench.get("model"))
        if name == "work":  # check 2.9's work probe, on the CPU
            return bench_model(self.meta()["models"]["public"], WORK_POSITIONS)
        if "@" in name:  # the public model with one path switched off (see ablate)
            return self.meta()["models"][name.split("@")[0]]
        return self.meta()["models"][name]

    def _load(self, name: str) -> None:
        spec = self.model_spec(name)
        weights = {}
        if not spec.get("on_device"):
            weights = self.ctx.seeded_weights(self.part, spec, lambda: checked_weights(spec, name))
        if "@" in name:
            weights = ablate(weights, name.split("@")[1])
        c = spec["config"]
        what = (
            f"DecoderOnlyTransformer({c['vocab_size']}, {c['d_model']}, {c['d_ff']}, "
            f"{c['num_layers']}, {c['max_seq_len']}) with the "
            + ("benchmark's seeded weights" if name in ("bench", "work") else "course weights")
        )
        header = load_header(name, spec)
        if name == "work":
            header["device"] = "cpu"
        try:
            self.ctx.worker(self.part).request(header, weights, what=what)
        except SubmissionError as exc:
            if exc.kind != "exception":
                raise
            names = matching_mistakes({"error": exc.signature}, self.signatures("load"), None)
            # Named in the feedback of the check that builds the model (2.1, which shows
            # the failure whole); the error is remembered for the others as a load failure.
            self.name(likely_cause(names, self.meta()["diagnoses"], "the error it raised"))
            raise SubmissionError(exc.message, "load", exc.output, exc.error) from None

    def call(
        self,
        header: dict[str, Any],
        arrays: dict[str, np.ndarray],
        what: str,
        timeout: float | None = None,
        key: str | None = None,
        timed: bool = False,
    ) -> Reply:
        self.ensure_model(header["model"])
        worker = self.ctx.worker(self.part)
        return worker.request(header, arrays, what=what, timeout=timeout, key=key, timed=timed)

    def forward(
        self, model: str, ids: np.ndarray, steps: list[int] | None, what: str
    ) -> tuple[np.ndarray, list[Any]]:
        """The submission's logits (B, T, vocab) for ``ids`` under a forward plan."""
        # Every forward case is its own timeout group: one slow long case must not
        # skip the short ones.
        header = {"op": "forward", "model": model, "steps": steps}
        reply = self.call(header, {"input_ids": ids}, what, key=what)
        return reply.arrays.get("logits"), reply.header.get("cache_shapes", [])

    def signatures(self, probe: str) -> dict[str, Any]:
        return self.meta().get("signatures", {}).get(probe, {})

    # ------------------------------------------------------------- running

    def run_case(
        self,
        model: str,
        ids: np.ndarray,
        steps: list[int] | None,
        expected: np.ndarray,
        positions: list[int] | None,
        label: str,
        show_values: bool,
    ) -> tuple[np.ndarray | None, list[Any]]:
        """Run one case; raise :class:`CaseFailure` with a student-facing message."""
        batch, length = ids.shape
        try:
            got, shapes = self.forward(model, ids, steps, what=f"forward ({label}, {plan(steps)})")
        except SubmissionError as exc:
            raise CaseFailure(with_output(exc.message, exc.output), exc.kind) from None
        vocab = self.meta()["models"][model]["config"]["vocab_size"]
        problem = logits_problem(got, (batch, length, vocab))
        if problem:
            kind = "shape" if "shape" in problem else "value"
            raise CaseFailure(Case(label, problem), kind)
        picked = got if positions is None else got[:, positions, :]
        result = compare(picked, expected, self.atol())
        if not result.ok:
            where = result.first_bad if positions is None else positions[result.first_bad or 0]
            first = position(where or 0, length)
            failure: Failure = LogitCase(label, result.max_error, self.atol(), first)
            if not show_values:
                failure = Case(label, f"logits are wrong (first wrong {first}).")
            else:  # the first failing public case's errors, step by step (self-check picture)
                errors = [round(e, 6) if np.isfinite(e) else None for e in result.per_position]
                self.note_detail("logit_errors", {
                    "case": label, "tolerance": self.atol(), "max_error": errors,
                    "positions": list(range(length)) if positions is None else list(positions),
                })  # fmt: skip
            raise CaseFailure(failure)
        return got, shapes

    def run_public(
        self, num: str, mode: str, expected_key: str, shapes_check: bool = False
    ) -> Outcome:
        """Every public course case under ``mode``; the first case's failure is diagnosed."""
        outcome = Outcome()
        plans = self.meta()["chunk_plans"]
        cases = self.course_cases()
        for i, case in enumerate(cases):
            ids = case["input_ids"]
            length = ids.shape[1]
            steps = {
                "no_cache": None,
                "full_cache": [length],
                "sequential": [1] * length,
                "chunks": plans[i],
            }[mode]
            label = f"case {i + 1} ({length} tokens)"
            outcome.total += 1
            try:
                _, shapes = self.run_case(
                    "public", ids, steps, case[expected_key], None, label, show_values=True
                )
                problem = self.cache_problem(shapes, ids.shape) if shapes_check else ""
                if problem:
                    raise CaseFailure(Case(label, problem))
                outcome.passed += 1
                continue
            except CaseFailure as exc:
                outcome.failures.append(exc.failure)
                if i == 0:
                    observed = self.observe_first(steps)
                    self.name(self.diagnose(mode, steps, observed))
                if exc.kind in FATAL:
                    outcome.total = len(cases)
                    return outcome
        if outcome.failures:
            self.isolate("public")
        return outcome

    def isolate(self, model: str) -> None:
        """After a check of logits failed: the place narrowed by experiment on ``model``
        (``Part2ForwardChecks`` runs them; nothing here)."""

    def isolate_generate(self) -> None:
        """After generate returned a wrong shape or prompt: its output narrowed by
        experiment (``Part2GenerateChecks`` runs it; nothing here)."""

    def observe_first(self, steps: list[int] | None) -> dict[str, Any]:
        """What the first public case gives: its logits, or the error it raises."""
        ids = self.course_cases()[0]["input_ids"]
        try:
            logits, _ = self.forward("public", ids, steps, what="forward (case 1)")
        except SubmissionError as exc:
            return {"error": exc.signature} if exc.signature else {}
        return {"logits": logits} if isinstance(logits, np.ndarray) and logits.ndim == 3 else {}

    def cache_problem(self, shapes: list[Any], ids_shape: tuple[int, int]) -> str:
        """Why the cache returned after the last call is not one (K, V) pair of
        (B, T, d_model) per layer ("" when it is)."""
        config = self.meta()["models"]["public"]["config"]
        want = [ids_shape[0], ids_shape[1], config["d_model"]]
        last = shapes[-1] if shapes else ["nothing"]
        layers = config["num_layers"]
        if len(last) != layers or any(layer != [want, want] for layer in last):
            return (
                f"the returned past_kv should be a list of {layers} (K, V) pairs, each tensor "
                f"shaped {tuple(want)} (B, T, d_model); got {json.dumps(last)}."
            )
        return ""

    def score(self, num: str, outcome: Outcome, set_score: Any, what: str = "cases") -> None:
        """Partial credit by the fraction of cases passed; failures listed (at most three)."""
        if not outcome.total:
            self.fail(f"No test cases for check {num}: run `python -m grader regen`.")
        set_score(round(points(num) * outcome.fraction, 4))
        self.say_count(outcome.passed, outcome.total, what)
        if outcome.failures:
            self.fail_with(outcome.listing())

    def run_hidden(self, num: str) -> Outcome:
        outcome = Outcome()
        cases = self.cases(num)
        wrong: list[str] = []  # the models of the cases whose values were wrong
        for case in cases:
            outcome.total += 1
            ids = np.array(case["input_ids"], dtype=np.int64)
            try:
                self.run_case(
                    case["model"],
                    ids,
                    case["steps"],
                    decode_array(case["expected"]),
                    case["positions"],
                    case["label"],
                    show_values=False,
                )
                outcome.passed += 1
            except SubmissionError as exc:  # the model could not be built
                outcome.failures.append(with_output(exc.message, exc.output))
            except CaseFailure as exc:
                outcome.failures.append(exc.failure)
                if exc.kind in FATAL - {"load"}:
                    outcome.total = len(cases)
                    return outcome
                wrong.append(case["model"])
        if wrong:
            self.isolate(wrong[0])
        return outcome

    # ------------------------------------------------------------ generate

    def generate(
        self, timing: bool = False, **overrides: Any
    ) -> tuple[np.ndarray, list[int], Sample]:
        """Seeded ``generate`` on the probe prompt; validated tokens, forward lengths, and
        the run's time and peak memory (:mod:`grader.runtime.timing`).

        ``timing`` runs are named apart (a timeout there does not skip other checks'
        calls) and get at least 30 s, as a busy machine must not fail them.
        """
        settings = {"model": "public", **self.meta()["generate"], **overrides}
        prompt = np.array(settings["prompt"], dtype=np.int64)
        ids = np.repeat(prompt, settings["batch"], axis=0)
        header = {
            "op": "generate",
            "model": settings["model"],
            "max_new_tokens": settings["new_tokens"],
            "temperature": settings["temperature"],
            "use_cache": settings["use_cache"],
            "seed": settings["seed"],
        }
        # None leaves an argument out of the call, to generate's own default.
        given = "".join(
            f", {k}={settings[k]}" for k in ("temperature", "use_cache") if settings[k] is not None
        )
        what = f"generate(input_ids of shape {ids.shape}, {settings['new_tokens']}{given})"
        if timing:
            what = f"timed {what}"
        timeout = max(self.ctx.limits.request_timeout_s, 30.0) if timing else None
        reply = self.call(header, {"input_ids": ids}, what, timeout=timeout, timed=timing)
        tokens = self.whole_sequence(reply.arrays.get("tokens"), ids, settings["new_tokens"], what)
        vocab = self.model_spec(settings["model"])["config"]["vocab_size"]
        if tokens.min() < 0 or tokens.max() >= vocab:
            self.fail(f"{what} returned token ids outside 0..{vocab - 1}.")
        lengths = reply.header.get("forward_lengths")
        if not isinstance(lengths, list) or not all(isinstance(n, int) for n in lengths):
            lengths = []
        return tokens, lengths, reply.sample()

    def whole_sequence(self, tokens: Any, ids: np.ndarray, n: int, what: str) -> np.ndarray:
        """The prompt followed by the new tokens (B, T + n), from either reading of the
        course's ``generate``: it returns (B, T + n) starting with the prompt, or only
        the n new tokens (B, n). Which one was seen is remembered for check 2.8's output."""
        batch, length = ids.shape
        got = tuple(tokens.shape) if isinstance(tokens, np.ndarray) else type(tokens).__name__
        if got not in ((batch, n), (batch, length + n)) or not np.array_equal(
            tokens[:, :length], ids
        ):
            self.isolate_generate()
        if got == (batch, n):
            self.ctx.scratch["part2.generate_returns"] = "new"
            return np.concatenate([ids, tokens], axis=1)  # (B, T + n)
        if got != (batch, length + n):
            self.fail(
                f"{what} returned shape {got}; expected {(batch, length + n)}, that is "
                "(B, T + max_new_tokens): the prompt, then the new tokens; or "
                f"{(batch, n)}, that is (B, max_new_tokens): only the new tokens."
            )
        if not np.array_equal(tokens[:, :length], ids):
            self.fail(
                f"{what} returned shape {got}, (B, T + max_new_tokens), but its first {length} "
                "tokens are not the prompt: the output must start with input_ids unchanged."
            )
        self.ctx.scratch["part2.generate_returns"] = "whole"
        return tokens

    def generate_convention(self) -> str:
        """Which reading of ``generate``'s result the submission was seen to use ("" if none)."""
        return {
            "whole": "generate returns the prompt followed by the new tokens, (B, T + n).",
            "new": "generate returns only the new tokens, (B, n); the grader puts the prompt "
            "in front of them. Both readings of the course's generate are accepted.",
        }.get(self.ctx.scratch.get("part2.generate_returns", ""), "")

    def generate_or_fail(
        self, timing: bool = False, **overrides: Any
    ) -> tuple[np.ndarray, list[int], Sample]:
        try:
            return self.generate(timing, **overrides)
        except SubmissionError as exc:
            self.fail(with_output(exc.message, exc.output))
