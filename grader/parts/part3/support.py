"""What the Part 3 checks share: building the student's Llama in the worker (from the
tiny checkpoint with ``Llama.build``, or from seeded weights), forward plans, seeded
generation with every forward call recorded, and naming known mistakes."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from grader.core.document import counted
from grader.core.feedback_items import Case, Cause, LogitCase
from grader.core.thresholds import load_thresholds
from grader.judging.base import Failure, GradedTestCase, likely_cause, with_output
from grader.judging.logits import (
    compare,
    explain,
    logits_problem,
    position,
    several_causes,
    signature_matches,
)
from grader.judging.timed_pools import build_pool
from grader.parts.part3 import live_pools
from grader.parts.part3.cases import (
    BENCH_MAX_BATCH,
    BENCH_MAX_SEQ_LEN,
    MEMORY_MAX_BATCH,
    MEMORY_MAX_SEQ_LEN,
    TOKENIZER_VOCAB,
    WORKLOAD_SEED,
    make_weights,
    plans,
    pool_key,
)
from grader.parts.part3.course import (
    SCALED,
    build_notes,
    expected_logits,
    generation_causes,
    rope_convention,
    rope_view,
)
from grader.parts.part3.sampling import judge_draws, own_band
from grader.runtime.outcomes import Reply, SubmissionError


class Part3Base(GradedTestCase):
    """Machinery of the Part 3 checks (no checks of its own)."""

    part = "part3"

    @classmethod
    def setUpClass(cls) -> None:
        """A benchmark model of the profile's own (a GPU workload) has its prompt pool built
        by the reference now, before the submission's worker first starts."""
        super().setUpClass()
        bench = load_thresholds(cls.ctx.device)["part3"]
        if "model" in bench:
            key = pool_key(bench["input_len"], bench["output_len"], bench["model"])
            if key not in cls.ctx.cases("part3").get("bench_pools", {}):
                build = functools.partial(live_pools.live_pool, cls(), bench)
                build_pool(cls.ctx, "part3", key, build)

    def raw(self) -> dict[str, Any]:
        """The case files as they are (every RoPE convention's values)."""
        return self.ctx.cases(self.part)

    def meta(self) -> dict[str, Any]:
        """The case data for the submission's RoPE convention (see :meth:`rope`)."""
        rope = self.rope()
        views = self.ctx.scratch.setdefault("part3.views", {})
        if rope not in views:
            views[rope] = rope_view(self.raw(), rope)
        return views[rope]

    def rope(self) -> str:
        """The RoPE convention of the submission: the one whose reference logits its
        cache-free forward matches on the first public case, probed once per grading
        (Llama 3.2's scaled RoPE while probing and whenever it matches neither)."""
        scratch = self.ctx.scratch
        if "part3.rope" not in scratch:
            scratch["part3.rope"] = SCALED
            case = next(c for c in self.raw()["cases"] if c["check"] == "3.2")
            failed = scratch.setdefault(f"{self.part}.failed", {})
            before = {key: entry[1] for key, entry in failed.items()}
            try:
                got = self.forward("public", np.array(case["tokens"], dtype=np.int64), "no_cache")
            except SubmissionError:
                got = None
            for key, entry in failed.items():  # the probe showed no failure to the student
                entry[1] = before.get(key)
            scratch["part3.rope"] = rope_convention(got, case, self.atol()) or SCALED
        return scratch["part3.rope"]

    def notes(self) -> dict[str, Any]:
        """How the worker built the submission's models (see ``adapter.build_notes``)."""
        return self.ctx.scratch.get("part3.notes", {})

    def print_build_notes(self) -> None:
        for line in build_notes(self.notes(), self.rope(), self.ctx.device):
            print(line)

    def atol(self) -> float:
        return float(self.raw()["atol"])

    # ---------------------------------------------------------------- models

    def settings(self, name: str, cache: bool, **extra: Any) -> dict[str, Any]:
        meta = self.raw()
        return {
            "model": name,
            "kv_caching": cache,
            "max_seq_len": meta["max_seq_len"],
            "max_batch_size": meta["max_batch_size"],
            **extra,
        }

    def checkpoint(self) -> str:
        """The public tiny checkpoint, copied where the worker can read it."""
        source = self.ctx.cases_root / "public" / self.raw()["checkpoint"]
        return str(self.ctx.sandbox.provide(source, "tiny_llama"))

    def ensure(self, name: str, cache: bool, *, full: bool = False) -> None:
        """Build model ``name`` (cached or cache-free) in the worker unless it is there.

        "public" and "bench" come from the checkpoint through ``Llama.build``; "hidden"
        from seeded weights through ``Llama(ModelArgs(...))``. A failure is remembered.
        """
        not_run = (
            f"Not run: your Llama could not be built (kv_caching={cache}); see check {{shown}}."
        )
        self.build_once(f"{name}:{cache}", lambda: self._build(name, cache), not_run, full=full)

    def _build(self, name: str, cache: bool) -> None:
        worker = self.ctx.worker(self.part)
        what = f"your Llama on the tiny checkpoint (kv_caching={cache})"
        if name == "hidden":
            spec = self.raw()["models"]["hidden"]
            draw = functools.partial(make_weights, spec["params"], spec["vocab_size"], spec["seed"])
            weights = self.ctx.seeded_weights(self.part, spec, draw)
            header = {
                "op": "load",
                **self.settings("hidden", cache),
                "params": spec["params"],
                "vocab_size": spec["vocab_size"],
            }
            what = f"Llama(ModelArgs(hidden sizes, kv_caching={cache}))"
            self.keep_notes(worker.request(header, weights, what=what))
            return
        if name == "workload":
            self.load_workload(cache)
            return
        ckpt = self.checkpoint()
        extra = {"ckpt_dir": ckpt, "tokenizer_path": f"{ckpt}/tokenizer.model"}
        if name in ("bench", "work"):
            extra.update(max_seq_len=BENCH_MAX_SEQ_LEN, max_batch_size=BENCH_MAX_BATCH)
        if name in ("memory", "sized", "sized_plain"):
            extra.update(max_seq_len=MEMORY_MAX_SEQ_LEN, max_batch_size=MEMORY_MAX_BATCH)
        if name in ("work", "memory", "sized", "sized_plain"):  # 3.7's and 3.1's probes: CPU
            extra["device"] = "cpu"
        # "fresh", "clean" and "switch": the public model once more, for check 3.8 alone.
        header = {"op": "build", **self.settings(name, cache), **extra}
        timeout = max(self.ctx.limits.request_timeout_s, 60)
        self.keep_notes(worker.request(header, what=what, timeout=timeout))

    def load_workload(self, cache: bool) -> None:
        """Check 3.11's model under a profile that sizes it: the public checkpoint's params
        with the profile's sizes, through ``Llama(ModelArgs(...))``, its seeded weights
        drawn by the worker on the grading device (``adapter_weights.draw_on``)."""
        bench = load_thresholds(self.ctx.device)["part3"]
        source = self.ctx.cases_root / "public" / self.raw()["checkpoint"] / "params.json"
        params = {**json.loads(source.read_text()), **bench["model"]}
        header = {
            "op": "load",
            **self.settings(
                "workload", cache, max_seq_len=bench["input_len"] + bench["output_len"],
                max_batch_size=max(bench["batch_sizes"]),
            ),
            "params": params,
            "vocab_size": TOKENIZER_VOCAB,
            "seed": WORKLOAD_SEED,  # the worker draws the weights on the grading device
            "on_device": True,
        }  # fmt: skip
        what = f"Llama(ModelArgs(the benchmark's sizes, kv_caching={cache}))"
        timeout = max(self.ctx.limits.request_timeout_s, 120)
        self.keep_notes(self.ctx.worker(self.part).request(header, what=what, timeout=timeout))

    def keep_notes(self, reply: Reply) -> None:
        """Keep what the worker said about a build, for :meth:`print_build_notes`."""
        if isinstance(reply.header, dict):
            self.ctx.scratch.setdefault("part3.notes", {}).update(reply.header)

    def call(
        self, header: dict[str, Any], arrays: dict[str, np.ndarray], what: str, **kw: Any
    ) -> Reply:
        self.ensure(header["model"], header.get("built_with", header["kv_caching"]))
        return self.ctx.worker(self.part).request(header, arrays, what=what, **kw)

    # -------------------------------------------------------------- forward

    def forward(self, model: str, tokens: np.ndarray, mode: str) -> np.ndarray:
        plan = plans(tokens.shape[1])[mode]
        header = {"op": "forward", "model": model, "kv_caching": mode != "no_cache", "steps": plan}
        what = f"forward ({model} model, {tokens.shape[1]} tokens, {describe(mode)})"
        reply = self.call(header, {"tokens": tokens}, what, key=what)
        return reply.arrays.get("logits")

    def check_case(self, case: dict[str, Any], mode: str) -> Failure | None:
        """None when the case passes in ``mode``, else the failing case (or the message of a
        submission that failed to answer)."""
        tokens = np.array(case["tokens"], dtype=np.int64)
        try:
            got = self.forward(case["model"], tokens, mode)
        except SubmissionError as exc:
            return with_output(exc.message, exc.output)
        vocab = self.meta()["models"][case["model"]]["vocab_size"]
        problem = logits_problem(got, (*tokens.shape, vocab))
        if problem:
            return Case(f"{case['label']}, {describe(mode)}", problem)
        positions = case["positions"]
        result = compare(got[:, positions, :], expected_logits(case, self.rope()), self.atol())
        if result.ok:
            return None
        where = position(positions[result.first_bad or 0], tokens.shape[1])
        return LogitCase(f"{case['label']}, {describe(mode)}", result.max_error, self.atol(), where)

    # ------------------------------------------------------------- generate

    def generate(
        self,
        prompts: list[str],
        cache: bool,
        model: str = "public",
        built_with: bool | None = None,
        **kw: Any,
    ) -> Reply:
        """``Llama.generate(kv_caching=cache)`` on ``model``, built with ``built_with``
        (default: the same ``kv_caching``, so no switch happens)."""
        gen = self.meta()["generate"]
        header = {
            "op": "generate",
            "model": model,
            "tokenizer": "public",
            "kv_caching": cache,
            "built_with": cache if built_with is None else built_with,
            "prompts": prompts,
            "max_gen_len": kw.pop("max_gen_len", gen["max_gen_len"]),
            "temperature": kw.pop("temperature", gen["temperature"]),
            "top_p": kw.pop("top_p", gen["top_p"]),
            "seed": kw.pop("seed", gen["seed"]),
            "record_logits": kw.pop("record_logits", True),
            "record_tokens": kw.pop("record_tokens", False),  # the isolation's evidence
        }
        if model in ("work", "memory", "sized", "sized_plain"):
            header["device"] = "cpu"
        if model != "public":  # other models share the public checkpoint's tokenizer
            self.ensure("public", True)
        what = f"generate({counted(len(prompts), 'prompt')}, kv_caching={cache})"
        return self.call(header, {}, what, **kw)

    def generate_or_fail(self, prompts: list[str], cache: bool, **kw: Any) -> Reply:
        try:
            return self.generate(prompts, cache, **kw)
        except SubmissionError as exc:
            self.fail(with_output(exc.message, exc.output) + self.cause_of_error(exc, cache))

    def handout_generation(self, cache: bool) -> Reply:
        """``generate`` of the handout's prompts on the public model in one mode, run once
        per grading: checks 3.5 (its text), 3.6 (its per-step logits) and 3.7 (its forward
        calls) read the same reply, which holds all three. Each reads what a first call
        in that mode gives; whether a later call gives the same is check 3.8's question,
        asked on models of its own. A call that failed is not kept: each check says so."""
        kept = self.ctx.scratch.setdefault(f"{self.part}.handout_generation", {})
        if cache not in kept:
            prompts = self.meta()["generate"]["prompts"]
            kept[cache] = self.generate_or_fail(prompts, cache, record_tokens=True)
        return kept[cache]

    # ------------------------------------------------------------ diagnosis

    def signatures(self, probe: str) -> dict[str, Any]:
        return self.meta().get("signatures", {}).get(probe, {})

    def name_mistakes(self, probe: str, observed: Any) -> str:
        """Name the catalogued mutants whose signature ``observed`` equals, in this check's
        feedback (:meth:`name`). Returns the words a message adds for them: none, as the
        page shows the causes apart.

        Naming is a hint beside a message that stands on its own: whatever the
        observation holds, this never raises (nothing is named when nothing can be said).
        """
        try:
            sigs = self.signatures(probe)
            names = [n for n, sig in sigs.items() if signature_matches(sig, observed)]
            self.name(likely_cause(names, self.meta()["diagnoses"], f"the {probe} probe"))
        except Exception:
            pass
        return ""

    def cause_of_error(self, exc: SubmissionError, cache: bool) -> str:
        probe = "generate_cached" if cache else "generate_no_cache"
        return self.name_mistakes(probe, {"error": exc.signature}) if exc.signature else ""

    def diagnose_forward(self, wrong: list[str], right: list[str]) -> str:
        """Name the mistakes that explain the forward modes seen ``wrong`` and ``right``.

        Each wrong mode is probed once more on the probe tokens; a mistake is named
        only when it explains every mode, not the error type of one probe alone (a
        mask without the start_pos columns and attention that ignores the cached keys
        raise the same shape error in chunks, but only the second is wrong one token
        at a time). Never raises (nothing is named when nothing can be said); returns the
        words a message adds: none, as the page shows the causes apart.
        """
        tokens = np.array(self.meta()["probe_tokens"], dtype=np.int64)
        observed: dict[str, Any] = {}
        for mode in wrong:
            try:
                observed[mode] = self.forward("public", tokens, mode)
            except SubmissionError as exc:
                observed[mode] = {"error": exc.signature}
        try:
            catalogue = {m: self.signatures(m) for m in [*wrong, *right]}
            names, several = explain(observed, catalogue, set(right))
            diagnoses = self.meta()["diagnoses"]
            evidence = "the forward modes, probed again"
            causes = several_causes(names, diagnoses) if several else []
            self.name(causes or likely_cause(names, diagnoses, evidence))
        except Exception:
            pass
        return ""

    def generation_cause(self, reply: Any, want: list[str], max_seq_len: int | None = None) -> str:
        """Name the course template's mistakes that explain ``reply``'s texts (see
        :func:`generation_causes`) in this check's feedback; returns the words a message
        adds for them: none, as the page shows the causes apart."""
        limit = max_seq_len or self.raw()["max_seq_len"]
        got = self.texts(reply)
        header = reply.header if isinstance(getattr(reply, "header", None), dict) else {}
        causes = generation_causes(header, got, want, self.raw(), limit)
        self.name([Cause(k, text, "the generated texts") for k, text in causes.items()])
        return ""

    def texts(self, reply: Any) -> list[str]:
        texts = reply.header.get("texts")
        return texts if isinstance(texts, list) else []

    def temperature_problem(self, top_p_right: bool = True) -> str:
        """ "" when ``generate`` samples the first token from softmax(logits / T) cut to the
        nucleus: drawn many times, every text lies in the nucleus and the likeliest one
        comes up as often as its probability says (within a band of six standard
        deviations, so a correct sampler with any seeding passes); else why not. Judged
        against the logits the submission sampled from (see :mod:`.sampling`)."""
        probe = self.meta()["sampling"]
        drawn: list[str] = []
        replies = []
        for seed in range(probe["calls"]):
            reply = self.generate(
                [probe["prompt"]] * probe["rows"],
                True,
                model="bench",
                max_gen_len=1,
                temperature=probe["temperature"],
                top_p=probe["top_p"],
                seed=seed,
                record_logits=seed == 0,  # the logits it draws from, once
            )
            replies.append(reply)
            drawn += [t for t in self.texts(reply) if isinstance(t, str)]
        logits = replies[0].arrays.get("step_logits")
        band = own_band(logits, self.raw().get("token_texts"), self.atol())
        verdict = judge_draws(drawn, probe, band or probe)
        if verdict.passed:
            return ""
        if band is None:  # the reference's distribution: the model's logits may explain it
            cause = self.generation_cause(replies[0], [])
        else:
            verdict.lines.insert(1, OWN_LOGITS_NOTE)
            self.name(self.sampling_causes(logits, verdict.names, top_p_right))
            cause = ""
        return "\n".join(line for line in [*verdict.lines, cause] if line)

    def sampling_causes(self, logits: Any, names: list[str], top_p_right: bool) -> list[Cause]:
        """The causes of draws that do not follow the nucleus of softmax(logits / T): the
        library's ``names`` (the checks narrow them: ``Part3Isolation``)."""
        return likely_cause(names, self.meta()["diagnoses"], "the draws")


#: Where check 3.10 judged the draws by the submission's own logits.
OWN_LOGITS_NOTE = (
    "The draws are judged against the distribution of your model's own logits for this "
    "prompt (what your generate samples from), whatever other checks say of them."
)


def describe(mode: str) -> str:
    return {
        "no_cache": "kv_caching off, one call from position 0",
        "cached": "kv_caching on, prefill then one token per call",
        "chunked": "kv_caching on, prefill then chunks of up to 4 tokens",
    }[mode]
