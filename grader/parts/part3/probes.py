"""Part 3's probes of the cache itself: check 3.1's capacity, memory and broken-checkpoint
probes, check 3.8's mode switches. Each adapts to a model built the course's way (no
``Llama.build``, the mode fixed when the model is built)."""

from __future__ import annotations

from typing import Any

from grader.judging.base import likely_cause, with_output
from grader.parts.part3.cases import (
    MAX_CACHE_MEMORY_RATIO,
    MEMORY_MAX_BATCH,
    MEMORY_MAX_SEQ_LEN,
    MIB,
    cache_bytes,
)
from grader.parts.part3.support import Part3Base
from grader.runtime.client_output import bounded_error
from grader.runtime.outcomes import SubmissionError

#: Check 3.8's mode switches: what goes wrong when a run's text differs.
SWITCH_PROBLEMS = {
    "after": "generate(kv_caching=False) after cached calls on the same model gave other "
    "text than a fresh model: the cache-free path used what the earlier calls left in the cache.",
    "on": "On a model built with kv_caching=False, generate(kv_caching=True) gave other text "
    "than a model built with the cache: switching the mode must switch every attention layer "
    "(set_kv_caching).",
    "back": "Switched back to kv_caching=False, the same model gave other text than a fresh "
    "cache-free model.",
}


class Part3Probes(Part3Base):
    """Probes of checks 3.1 and 3.8 (no checks of their own)."""

    def capacity_problems(self) -> list[str]:
        """With kv_caching on, ``max_batch_size`` rows of ``max_seq_len`` tokens fed as a
        prefill, then one token per call up to the last cache slot, must give the
        reference's logits (compared here): a cache smaller than (max_batch_size,
        max_seq_len, n_kv_heads, head_dim) cannot hold them. The cache is blamed only when
        the cache-free forward of the same tokens is right."""
        problems = []
        for case in self.cases("3.1"):
            problem = self.check_case(case, "cached")
            if not problem:
                continue
            if self.check_case(case, "no_cache"):
                problems.append(
                    f"{problem}\nWithout the cache the same tokens give wrong logits too: the "
                    "difference is not the cache's (see check 3.2)."
                )
                continue
            problems.append(
                f"{problem}\nWith kv_caching=True the model must serve every row up to "
                "max_batch_size and every position up to max_seq_len from its cache of "
                "shape (max_batch_size, max_seq_len, n_kv_heads, head_dim)."
            )
        return problems

    def build_error_problems(self) -> list[str]:
        """``Llama.build`` on a checkpoint with an unknown params.json key, and on one
        without weights, must raise an error naming what is wrong. Code built the course's
        way (no ``build``) has nothing to ask."""
        if self.notes().get("built_by") == "constructor":
            return []
        problems = []
        for broken, wanted in (("unknown_key", "my_new_key"), ("no_weights", "consolidated")):
            ckpt = self.broken_checkpoint(broken)
            header = {
                "op": "build_error",
                **self.settings("public", True),
                "ckpt_dir": ckpt,
                "tokenizer_path": f"{self.checkpoint()}/tokenizer.model",
            }
            reply = self.ctx.worker(self.part).request(header, what="Llama.build(broken)")
            raised, message = reply.header.get("raised"), str(reply.header.get("message", ""))
            if raised is None or wanted not in message:
                what = "an unknown params.json key" if broken == "unknown_key" else "a missing file"
                cut = bounded_error({"type": raised, "message": message})  # a forged reply's text
                did = f"raised {cut['type']}: {cut['message']}" if raised else "did not raise"
                problems.append(
                    f"Llama.build on a checkpoint with {what} should raise an error naming "
                    f"{wanted!r}; it {did}."
                )
        return problems

    def broken_checkpoint(self, kind: str) -> str:
        """A worker-readable copy of the tiny checkpoint, broken the ``kind`` way (once)."""
        import json

        name = f"broken_{kind}"
        if (self.ctx.sandbox.data_dir / name).exists():
            return str(self.ctx.sandbox.data_dir / name)
        good = self.ctx.cases_root / "public" / self.raw()["checkpoint"]
        dest = self.ctx.sandbox.provide(good, name)
        if kind == "unknown_key":
            params = json.loads((dest / "params.json").read_text())
            (dest / "params.json").write_text(json.dumps({**params, "my_new_key": 1}))
        else:
            (dest / "consolidated.00.pth").unlink()
        return str(dest)

    def memory_problems(self) -> list[str]:
        """Check 3.1's memory probe, judged on the worker's resident memory as the kernel
        reports it (read here, after the worker handed its free pages back): on a CPU model
        built without the cache, a cache-free ``generate`` must not grow it by anything
        like a cache, and what a cached ``generate`` then allocated must be released when
        ``generate(kv_caching=False)`` switches the cache off. Only growth that is seen is
        judged (a cache of ``torch.empty`` pages never touched does not show)."""
        params = self.meta()["models"]["public"]["params"]
        cache = cache_bytes(params, MEMORY_MAX_BATCH, MEMORY_MAX_SEQ_LEN)
        # Without a runtime switch (the course's code) only the cache-free run is judged:
        # a model built without the cache has none to allocate or free.
        switch = self.notes().get("switch", True)
        steps = [None, ("memory", False, False)]
        steps += [("memory", True, False), ("memory", False, False)] if switch else []
        try:
            resident = self.resident_after(steps, settle_on=("memory", False))
        except SubmissionError as exc:
            return [with_output(exc.message, exc.output)]
        plain = resident[1] - resident[0]
        cached, freed = (resident[2] - resident[1], resident[2] - resident[3]) if switch else (0, 0)
        where = (
            f"On the tiny model built with kv_caching=False, max_batch_size={MEMORY_MAX_BATCH} "
            f"and max_seq_len={MEMORY_MAX_SEQ_LEN} (a cache of {cache / MIB:.0f} MiB), your "
            "process's resident memory, read by the grader"
        )
        switched = (
            f", then with it {cached / MIB:+.1f} MiB, then switched off {-freed / MIB:+.1f} MiB"
            if switch
            else ""
        )
        print(
            f"Memory probe (resident memory read by the grader, a {cache / MIB:.0f} MiB cache): "
            f"generate without the cache {plain / MIB:+.1f} MiB{switched}."
        )
        problems = []
        if not plain < cache / 2:  # NaN is never below
            problems.append(
                f"{where}, grew by {plain / MIB:.1f} MiB during generate(kv_caching=False): "
                "with the cache off, no cache_k/cache_v may be allocated."
            )
        elif not cached < cache / 2 and not freed >= cached / 2:  # NaN fails both ways
            problems.append(
                f"{where}, grew by {cached / MIB:.1f} MiB during generate(kv_caching=True) and "
                f"shrank by only {freed / MIB:.1f} MiB when generate(kv_caching=False) switched "
                "the cache off: set_kv_caching(False) must drop every layer's cache "
                "(cache_k = cache_v = None) so its memory is freed."
            )
        return problems

    def cache_size_problems(self) -> list[str]:
        """Check 3.1's cache-size probe, on the resident memory the grader reads: what
        building a CPU model with kv_caching=True and one cached ``generate`` add (the
        cache, whichever allocates it: the course's constructor or the kit's first call),
        less what the same with kv_caching=False adds (the weights), over the bytes of a
        cache of ``n_kv_heads`` heads. A cache that holds every query head (GQA expanded
        before the cache) takes n_heads / n_kv_heads times that."""
        params = self.meta()["models"]["public"]["params"]
        cache = cache_bytes(params, MEMORY_MAX_BATCH, MEMORY_MAX_SEQ_LEN)
        try:
            steps = [None, ("sized_plain", False, False), ("sized", True, True)]
            resident = self.resident_after(steps, settle_on=("public", True))
        except SubmissionError as exc:
            return [with_output(exc.message, exc.output)]
        grown = (resident[2] - resident[1]) - (resident[1] - resident[0])
        ratio = grown / cache
        print(
            f"Cache-size probe: a model built with kv_caching=True and a cached generate took "
            f"{grown / MIB:.1f} MiB more than one without the cache, {ratio:.2f}x a cache of "
            f"n_kv_heads heads ({cache / MIB:.0f} MiB; at most {MAX_CACHE_MEMORY_RATIO:g}x)."
        )
        if ratio <= MAX_CACHE_MEMORY_RATIO:  # NaN never is
            return []
        problem = (
            f"On the tiny model with max_batch_size={MEMORY_MAX_BATCH} and max_seq_len="
            f"{MEMORY_MAX_SEQ_LEN}, your process's resident memory, read by the grader, grew "
            f"by {grown / MIB:.1f} MiB more with kv_caching=True than without: {ratio:.2f}x a "
            "cache of (max_batch_size, max_seq_len, n_kv_heads, head_dim) in the model's dtype."
        )
        return [f"{problem} {self.cache_size_cause(params)}".strip()]

    def cache_size_cause(self, params: dict[str, Any]) -> str:
        """Why the cache takes more memory than its size, where what the worker reports of
        the cached public model shows it: cache tensors wider than the model's weights
        (float64 for a float32 model), or a cache of every query head (GQA expanded
        before the cache); "" where it shows neither (a hint: never decides the check)."""
        report = self.cache_report().get(True, {})
        heads = {
            shape[2]
            for layer in report.get("shapes") or []
            for shape in (layer if isinstance(layer, list) else [])
            if isinstance(shape, list) and len(shape) == 4
        }
        dtypes = report.get("dtypes") if isinstance(report.get("dtypes"), dict) else {}
        model, cache = dtypes.get("model"), dtypes.get("cache") or []
        if heads == {params["n_kv_heads"]} and model and any(d != model for d in cache):
            named = ["cache_float64"] if "float64" in cache else []
            self.name(likely_cause(named, self.meta()["diagnoses"], "the cache's dtypes"))
            return (
                f"Your process reports caches of the right shape, in {', '.join(cache)} where "
                f"the model computes in {model}."
            )
        if heads == {params["n_heads"]} != {params["n_kv_heads"]}:
            return (
                "The cache must hold n_kv_heads heads (grouped-query attention): store xk and "
                "xv as they are and call repeat_kv after reading them."
            )
        return ""

    def cache_report(self) -> dict[bool, dict[str, Any]]:
        """What the worker says the public models' attention layers hold now, per
        ``kv_caching``: ``shapes`` (cache_k / cache_v per layer) and ``dtypes`` (of the
        cache tensors and of the model); a mode whose model cannot answer is left out."""
        found = {}
        for cache in (True, False):
            try:
                header = {"op": "cache_shapes", "model": "public", "kv_caching": cache}
                reply = self.call(header, {}, f"inspecting cache_k / cache_v (kv_caching={cache})")
            except SubmissionError:
                continue
            found[cache] = reply.header if isinstance(reply.header, dict) else {}
        return found

    def resident_after(
        self, steps: list[tuple[str, bool, bool] | None], settle_on: tuple[str, bool]
    ) -> list[float]:
        """The worker's resident memory, read by the grader after each step (NaN where it
        cannot be read): None reads it as it is; (model, kv_caching, built with) first
        runs a short ``generate``. Freed memory is handed back before every reading, by
        model ``settle_on`` (name, built with; built first if it is not there yet)."""
        worker = self.ctx.worker(self.part)
        prompts = self.meta()["generate"]["second_prompts"]
        resident = []
        for step in steps:
            if step is not None:
                model, cache, built = step
                run = {"max_gen_len": 2, "record_logits": False}
                self.generate(prompts, cache, model=model, built_with=built, **run)
            settle = {"op": "settle", "model": settle_on[0], "kv_caching": settle_on[1]}
            self.call(settle, {}, "releasing freed memory")
            rss = worker.rss_bytes()
            resident.append(float("nan") if rss is None else float(rss))
        return resident

    def reported_shapes(self) -> str:
        """What the worker says the attention layers of the public models hold: a hint for
        feedback (the submission's process reports it, so it never decides a check)."""
        found = [
            f"kv_caching={cache}: {report.get('shapes', [])}"
            for cache, report in self.cache_report().items()
        ]
        if not found:
            return ""
        return "Hint, as your process reports them: cache_k / cache_v shapes per layer, " + (
            "; ".join(found) + "."
        )

    # ------------------------------------------------------------ mode switches

    def check_mode_switches(self, gen: dict[str, Any]) -> None:
        """``Llama.generate(kv_caching=...)`` switches the model it is called on: a
        cache-free call after cached ones, and a cached call on a model built without
        the cache, give what a model built for that mode gives. A run whose text differs
        from the reference's as that model's does is not the switch's fault."""
        meta = self.meta()
        runs = {  # name -> (prompts, kv_caching, built with, expected texts)
            "after": (gen["second_prompts"], False, True, meta["expected_second"]),
            "on": (gen["prompts"], True, False, meta["expected_texts"]),
            "back": (gen["second_prompts"], False, False, meta["expected_second"]),
        }
        if not self.notes().get("switch", True):  # the mode is fixed when the model is built
            runs = {"after": runs["after"]}
        observed: dict[str, Any] = {}
        for name, (prompts, cache, built, _) in runs.items():
            model = "fresh" if built else "switch"
            try:
                reply = self.generate(prompts, cache, model=model, built_with=built)
                observed[name] = self.texts(reply)
            except SubmissionError as exc:
                observed[name] = {"error": exc.signature}
        wrong = [n for n, run in runs.items() if observed[n] != run[3]]
        # Text a model built for the run's mode gives too is wrong from the start (check
        # 3.5's): the switch itself did what it must.
        same = [n for n in wrong if observed[n] == self.built_for_mode(*runs[n][:2])]
        for name in same:
            prompts, cache = runs[name][:2]
            print(
                f"generate(kv_caching={cache}) after a switch of the mode gave other text "
                f"than the reference on {len(prompts)} prompts, the same as your model built "
                f"with kv_caching={cache}: the switch is right; the text is wrong from the "
                "start (see check 3.5)."
            )
        problems = [SWITCH_PROBLEMS[n] for n in wrong if n not in same]
        if problems:
            problems.append(self.name_mistakes("mode_switch", observed))
            self.fail("\n".join(p for p in problems if p))

    def built_for_mode(self, prompts: list[str], cache: bool) -> list[str] | None:
        """The texts of ``prompts`` on the public model built with ``kv_caching=cache``,
        never switched (None where it fails)."""
        try:
            return self.texts(self.generate(prompts, cache))
        except SubmissionError:
            return None
