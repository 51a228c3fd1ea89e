"""Part 4's check machinery and small judgements, in trusted code: the base class of
the checks (the cases, the worker's models and requests, the catalogue's names for
what a submission did), the worker's encoded values read back as plain Python, and
what a generation that gave other tokens did. The int8 cache is judged in
:mod:`grader.parts.part4.int8`, ``measure_latency`` and the timed runs in
:mod:`grader.parts.part4.latency`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.core.feedback_items import Case, Cause
from grader.core.points import points
from grader.core.thresholds import load_thresholds
from grader.judging.base import GradedTestCase, Outcome, likely_cause, with_output
from grader.judging.timed_pools import build_pool, pool_fault, pools_built
from grader.parts.part4 import live_pools
from grader.parts.part4.pools import PROMPT_LEN
from grader.runtime.outcomes import Reply, SubmissionError


def plain_value(enc: Any, depth: int = 0) -> Any:
    """A value encoded by the worker's ``encode_value`` as plain Python (non-finite floats
    as NaN, anything else unreadable as None)."""
    if not isinstance(enc, dict) or depth > 4:
        return None
    kind, value = enc.get("kind"), enc.get("value")
    if kind == "dict" and isinstance(value, dict):
        return {k: plain_value(v, depth + 1) for k, v in value.items()}
    if kind == "list" and isinstance(value, list):
        return [plain_value(v, depth + 1) for v in value]
    if kind == "int" and isinstance(value, int):
        return value
    if kind == "float":
        return float(value) if isinstance(value, int | float) else float("nan")
    return None


def generation_problem(
    case: dict[str, Any],
    cached: bool,
    prefix: int,
    lengths: list[Any],
    cause: Callable[[list[str]], str],
) -> Case:
    """What a generation that gave other tokens did, from the calls it made (``cause``
    names catalogued mistakes)."""
    if prefix:
        total = len(case["ids"][0])
        problem = "generate_with_cache_from gave other tokens."
        if lengths and lengths[0] != total - prefix:
            problem += (
                f" Its first call fed {lengths[0]} tokens, but the cache already held "
                f"{prefix} of the {total}: feed only the {total - prefix} it does not hold."
            )
            if lengths[0] == total:
                problem += cause(["cache_from_refeeds_prompt"])
        return Case(case["label"], problem)
    mode = "with" if cached else "without"
    problem = f"greedy generation {mode} the cache gave other tokens."
    if cached and any(x != 1 for x in lengths[1:]):
        problem += (
            f" forward received {lengths} tokens per call: after the prompt, each "
            "cached step must feed only the newest token."
        )
    return Case(case["label"], problem)


@dataclass(frozen=True)
class WrongValue:
    """A case a function got wrong: the call as shown, what it returned, and what each
    catalogued mistake returns there (``mistakes``, stored with the case)."""

    what: str
    got: int
    mistakes: dict[str, Any]


def summarise_wrong_values(
    wrong: list[WrongValue], total: int
) -> tuple[list[Case | str], list[str]]:
    """Feedback lines for the wrong values of a check's cases, and the mistakes that
    explain them. A mistake whose value every wrong case returned is named, once, with
    one example, not case by case; wrong values that no single mistake explains are
    listed as they are (the caller cuts a long list)."""
    if not wrong:
        return [], []
    names = [
        name for name in wrong[0].mistakes if all(w.mistakes.get(name) == w.got for w in wrong)
    ]
    if not names:
        return [Case(w.what, f"{w.got:,}", "compared exactly") for w in wrong], []
    first = wrong[0]
    line = (
        f"{len(wrong)} of {total} cases returned a wrong value, all wrong in the same way; "
        f"e.g. {first.what} returned {first.got:,}."
    )
    return [line], names


#: What unpacking transformers 5's cache as (key, value) pairs raises: its items are triples.
UNPACKED_AS_PAIRS = "too many values to unpack (expected 2)"
#: The third item of such a triple (``sliding_window``) is None on GPT-2.
USED_THE_THIRD_ITEM = "'NoneType' object has no attribute"
CACHE_API_HINT = (
    "This is the course lab's `for k, v in past_key_values`: with the transformers the "
    "grader uses (5.x) the cache is a DynamicCache whose items are (keys, values, "
    "sliding_window) triples, not pairs. Use the provided kv_pairs(past_key_values), or "
    "read past_key_values.layers[i].keys and .values."
)
THIRD_ITEM_HINT = (
    "Your code iterates the cache as the course lab did (each item a (keys, values) pair): "
    "with the transformers the grader uses (5.x) the cache is a DynamicCache whose items "
    "are (keys, values, sliding_window) triples, and sliding_window is None here. Use the "
    "provided kv_pairs(past_key_values), or read past_key_values.layers[i].keys and .values."
)


def cache_api_hint(exc: SubmissionError) -> str:
    """The cause in one sentence where the submission iterated the cache as the course's
    lab did (pairs, the API before transformers 5): unpacking two names, or using every
    item of a layer (the None third one included); "" for any other failure."""
    error = exc.error
    kind, message = error.get("type"), str(error.get("message", ""))
    lines = [line.strip() for line in str(error.get("traceback", "")).splitlines()]
    if kind == "ValueError" and message.startswith(UNPACKED_AS_PAIRS):
        loops = [line for line in lines if in_order(line, FOR_WORD, ",", IN_WORD)]
        return CACHE_API_HINT if any("past" in line or "cache" in line for line in loops) else ""
    if kind == "AttributeError" and message.startswith(USED_THE_THIRD_ITEM):
        over_cache = [
            line
            for line in lines
            if in_order(line, FOR_WORD, IN_WORD, "past")
            or in_order(line, FOR_WORD, IN_WORD, "cache")
        ]
        return THIRD_ITEM_HINT if over_cache else ""
    return ""


FOR_WORD, IN_WORD = re.compile(r"\bfor\b"), re.compile(r"\bin\b")


def in_order(line: str, *marks: re.Pattern[str] | str) -> bool:
    r"""Whether ``marks`` (words or plain text) occur in ``line`` one after the other, as
    ``\bfor\b.*,.*\bin\b`` asks: each found after the end of the one before, the earliest
    each time. Linear in the line, which is the student's source (that expression
    backtracked for seconds on a line of a few thousand characters)."""
    at = 0
    for mark in marks:
        if isinstance(mark, str):
            found = line.find(mark, at)
            if found < 0:
                return False
            at = found + len(mark)
        else:
            match = mark.search(line, at)
            if match is None:
                return False
            at = match.end()
    return True


def positions_hint(exc: SubmissionError, n_positions: int | None) -> str:
    """The cause of a bare "index out of range in self" from the model's position
    embedding: positions past ``n_positions`` (re-feeding the sequence on top of a cache
    shifts every position by the cached length); "" for any other failure."""
    error = exc.error
    if error.get("type") != "IndexError" or "index out of range in self" not in str(
        error.get("message", "")
    ):
        return ""
    limit = f" ({n_positions})" if n_positions else ""
    return (
        f"the model was asked for positions past its n_positions{limit}. With a "
        "cache, each call's positions start after the tokens the cache holds, so feeding the "
        "whole sequence again on top of the cache runs past the end: feed only the newest "
        "token."
    )


def bench_spec(cases: dict[str, Any], bench: dict[str, Any]) -> dict[str, Any]:
    """Check 4.6's model under profile ``bench``: the lab model, with the profile's sizes
    where it names any (a GPU workload), room for its prompt and longest L, same seed, its
    weights drawn on the grading device (``on_device``): its prompts are built there in the
    grading, so no stored answer needs the CPU's draw, and a GPU draws the 0.3 billion
    weights in milliseconds where a core took 7-10 s."""
    lab = cases["models"]["lab"]
    if "model" not in bench:
        return lab
    positions = PROMPT_LEN + max(bench["L_values"])
    config = {**lab["config"], **bench["model"]}
    config["n_positions"] = max(config["n_positions"], positions)
    return {"config": config, "seed": lab["seed"], "on_device": True}


class Part4Base(GradedTestCase):
    """Part 4's machinery: the cases, the worker's models and requests, and the
    catalogue's names for what a submission did."""

    part = "part4"

    # ------------------------------------------------------------- machinery

    def meta(self) -> dict[str, Any]:
        return self.ctx.cases(self.part)

    @classmethod
    def setUpClass(cls) -> None:
        """A benchmark model of the profile's own (a GPU workload) has its prompts built by
        the reference now, before the submission's worker first starts."""
        super().setUpClass()
        bench = load_thresholds(cls.ctx.device)["part4"]
        if "model" in bench:
            spec = bench_spec(cls.ctx.cases("part4"), bench)
            build = functools.partial(live_pools.live_pool, cls.ctx, spec, bench)
            build_pool(cls.ctx, "part4", live_pools.KEY, build)

    def model_spec(self, name: str) -> dict[str, Any]:
        """Config and seed of model ``name``: stored in the cases, except the benchmark's
        under a profile that sizes it ("bench", see :func:`bench_spec`)."""
        if name == "bench":
            return bench_spec(self.meta(), load_thresholds(self.ctx.device)["part4"])
        return self.meta()["models"][name]

    def ensure(self, name: str) -> None:
        spec = self.model_spec(name)
        header = {"op": "build", "model": name, **spec}
        self.once_per_worker(
            name,
            lambda: self.ctx.worker(self.part).request(header, what="building the GPT-2 model"),
        )

    def call(
        self,
        header: dict[str, Any],
        arrays: dict[str, np.ndarray],
        what: str,
        soft: bool = False,
        **kw: Any,
    ) -> Reply:
        """One request; a submission problem fails the check (``soft``: is raised)."""
        try:
            self.ensure(header.get("model", "lab"))
            return self.ctx.worker(self.part).request(header, arrays, what=what, **kw)
        except SubmissionError as exc:
            hint = cache_api_hint(exc)
            if hint:
                self.name([Cause("cache_iterated_as_pairs", hint, "the error it raised")])
            else:
                spec = self.model_spec(header.get("model", "lab"))
                hint = positions_hint(exc, spec.get("config", {}).get("n_positions"))
                if hint:
                    why = "an IndexError from the position embedding"
                    self.name([Cause("positions_past_n_positions", hint, why)])
            if soft:
                raise exc from None
            self.fail(with_output(exc.message, exc.output))

    def generate(
        self,
        model: str,
        ids: np.ndarray,
        n: int,
        cached: bool,
        prefix: int = 0,
        tokens_only: bool = False,
        **kw: Any,
    ) -> Reply:
        """A generation's reply: its tokens and, unless ``tokens_only`` (a timed run, whose
        logits would outgrow a reply on a GPU workload and cost time to send), every
        step's logits."""
        if prefix:
            fn, past = "generate_with_cache_from", f"a cache of its first {prefix} tokens, "
        else:
            fn, past = ("generate_with_cache" if cached else "generate_no_cache"), ""
        header = {"op": "generate", "model": model, "n": n, "cached": cached}
        if prefix:
            header["cached_prefix"] = prefix
        if tokens_only:
            header["tokens_only"] = True
        return self.call(
            header, {"ids": ids}, f"{fn}(model, input_ids {ids.shape}, {past}{n})", **kw
        )

    def named(self, observed: dict[str, Any]) -> str:
        """Name the catalogued mistakes that match ``observed`` (probe ->
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
        self.name(likely_cause(names, self.meta()["diagnoses"], "the probes' tokens"))
        return ""

    def finish(self, num: str, outcome: Outcome, set_score: Any) -> None:
        set_score(round(points(num) * outcome.fraction, 4))
        self.say_count(outcome.passed, outcome.total)
        if outcome.failures:
            self.fail_with(outcome.listing())

    def cause(self, names: list[str]) -> str:
        """Name the catalogued mistakes ``names``, seen in what the submission did, in this
        check's feedback (its causes, each once). Returns the words a message adds for
        them: none, as the page shows the causes apart."""
        self.name(likely_cause(names, self.meta()["diagnoses"], "what the check saw"))
        return ""

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
            "cached_use_cache": reply.header.get("use_cache"),
            "cached_past": reply.header.get("past_given"),
            "cached_tokens": tokens.tolist() if isinstance(tokens, np.ndarray) else None,
        })  # fmt: skip

    def timed_prompts(self) -> list[dict[str, Any]]:
        """The latency prompts with the reference's tokens: those the reference built for
        this grading under a profile with a model of its own, else the stored hidden ones
        where present."""
        if "model" in load_thresholds(self.ctx.device)["part4"]:
            built = pools_built(self.ctx, self.part).get(live_pools.KEY, [])
            if isinstance(built, str):
                self.fail(pool_fault(built))
            return built
        cases = self.cases("4.6")
        hidden = [c for c in cases if c.get("visibility") == "hidden"]
        return hidden or cases
