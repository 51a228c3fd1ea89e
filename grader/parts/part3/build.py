"""Building Part 3's files from the reference Llama and its mutants (``regen`` only)."""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from grader.core.arrays import encode_array
from grader.core.arrays import weights_digest as digest
from grader.parts.part3 import adapter, adapter_load
from grader.parts.part3.build_generate import (
    HIDDEN_STOP_SEED,
    cache_observation,
    full_batch,
    sampling_probe,
    stop_batch,
    token_texts,
)
from grader.parts.part3.build_pools import bench_pools
from grader.parts.part3.cache_contents import CACHE_FILE, probe_document, reference_probe
from grader.parts.part3.cases import (
    ATOL,
    CAPACITY_SEED,
    COURSE_PROMPTS,
    GENERATE,
    GROWTH_PROMPT,
    MAX_BATCH,
    MAX_SEQ_LEN,
    MODELS,
    N_RANKS,
    TOP_P,
    TOP_P_PROBS,
    WORK_PROMPT,
    benchmark_prompt,
    checkpoint_files,
    make_weights,
    plans,
)

CKPT = "part3/tiny_llama"
#: The cache-contents probe's ids, and the reference's keys and values of every layer and
#: logits (see ``cache_contents.reference_layers``).
Contents = tuple[np.ndarray, dict[str, Any]] | None
VOCAB = N_RANKS + 256
POSITIONS = 6
SECOND_PROMPTS = ["Hello", "The capital of France is"]
HIDDEN_PROMPTS = ["Once upon a time", "def fibonacci(n):", "Les sanglots longs des violons"]


@contextlib.contextmanager
def llama_on_path(root: Path) -> Iterator[None]:
    """``import llama`` finds the package under ``root`` (reference or mutant) inside
    this block; ``llama`` modules imported before are set aside and put back after."""

    def take() -> dict[str, ModuleType]:
        names = [m for m in sys.modules if m == "llama" or m.startswith("llama.")]
        return {m: sys.modules.pop(m) for m in names}

    saved = take()
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        take()
        sys.modules.update(saved)


def import_llama(root: Path) -> dict[str, ModuleType]:
    """The ``llama`` package under ``root`` (reference or mutant), imported afresh."""
    with llama_on_path(root):
        return {
            n: importlib.import_module(f"llama.{n}") for n in ("model", "generation", "tokenizer")
        }


def tokenizer_bytes(reference: dict[str, ModuleType]) -> bytes:
    tok = reference["tokenizer"]
    with tempfile.TemporaryDirectory() as tmp:
        path = tok.write_truncated_bpe(tok.cl100k_path(), Path(tmp) / "tokenizer.model", N_RANKS)
        return Path(path).read_bytes()


def settings(
    name: str, kv_caching: bool, ckpt_dir: Path | None = None, scaled: bool = True
) -> dict[str, Any]:
    """A build request for model ``name``; ``scaled``: RoPE with Llama 3.2's frequency
    scaling (the checkpoints' ``use_scaled_rope``), else plain RoPE (the course's code)."""
    params, _ = MODELS.get(name, MODELS["public"])
    out: dict[str, Any] = {
        "model": name,
        "params": {**params, "use_scaled_rope": scaled},
        "vocab_size": VOCAB,
        "max_seq_len": MAX_SEQ_LEN,
        "max_batch_size": MAX_BATCH,
        "kv_caching": kv_caching,
    }
    if ckpt_dir is not None:
        out.update(ckpt_dir=str(ckpt_dir), tokenizer_path=str(ckpt_dir / "tokenizer.model"))
    return out


class Observer:
    """A package's models (cached and cache-free) on the public and hidden weights, with
    the RoPE convention of the checkpoint at ``ckpt_dir`` (see :func:`rope_checkpoint`)."""

    def __init__(self, pkg: dict[str, ModuleType], ckpt_dir: Path) -> None:
        self.pkg = pkg
        self.ckpt = ckpt_dir
        self.scaled = bool(json.loads((ckpt_dir / "params.json").read_text())["use_scaled_rope"])
        self.models: dict[tuple[str, bool], Any] = {}
        for cache in (True, False):
            model, self.tokenizer = adapter_load.build_from_checkpoint(
                pkg, settings("public", cache, ckpt_dir)
            )
            self.models["public", cache] = model
            params, seed = MODELS["hidden"]
            weights = make_weights(params, VOCAB, seed)
            self.models["hidden", cache] = adapter_load.build_from_arrays(
                pkg, settings("hidden", cache, scaled=self.scaled), weights
            )

    def forward(self, model: str, tokens: np.ndarray, mode: str) -> np.ndarray:
        plan = plans(tokens.shape[1])[mode]
        return adapter.run_forward(self.models[model, mode != "no_cache"], tokens, plan)

    def generate(self, model: str, prompts: list[str], cache: bool, **kw: Any) -> dict[str, Any]:
        """The seeded ``generate`` of the handout's settings (``kw`` overrides them)."""
        run = {**GENERATE, "kv_caching": cache, **kw}
        return adapter.run_generate(self.models[model, cache], self.tokenizer, prompts, run)


def _catch(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}


def probes(obs: Observer, tokens: np.ndarray, contents: Contents = None) -> dict[str, Any]:
    """What a package shows on each diagnostic probe (plain JSON values); with
    ``contents`` (the probe's ids and the reference's keys and values), what check 3.7's
    cache-contents probe sees too."""
    from grader.core.arrays import fingerprint

    out: dict[str, Any] = {}
    for mode in ("no_cache", "cached", "chunked"):
        out[mode] = _catch(lambda m=mode: {"logits": fingerprint(obs.forward("public", tokens, m))})
    for cache in (True, False):
        key = "generate_cached" if cache else "generate_no_cache"
        result = _catch(lambda c=cache: obs.generate("public", COURSE_PROMPTS, c))
        out[key] = result.get("texts", result)
        out[f"{key}_calls"] = result.get("calls", result)

    def second() -> Any:  # on a fresh model, as check 3.8 does
        fresh, tokenizer = adapter_load.build_from_checkpoint(
            obs.pkg, settings("fresh", True, obs.ckpt)
        )
        run = {**GENERATE, "kv_caching": True}
        adapter.run_generate(fresh, tokenizer, COURSE_PROMPTS, run)
        first = adapter.run_generate(fresh, tokenizer, SECOND_PROMPTS, run)["texts"]
        again = _catch(lambda: adapter.run_generate(fresh, tokenizer, SECOND_PROMPTS, run)["texts"])
        return first if again == first else {"repeat_differs": True}

    out["second_call"] = _catch(second)

    def switches() -> dict[str, Any]:  # as check 3.8 does after its second-call probe
        fresh, tokenizer = adapter_load.build_from_checkpoint(
            obs.pkg, settings("fresh", True, obs.ckpt)
        )
        cached, plain = {**GENERATE, "kv_caching": True}, {**GENERATE, "kv_caching": False}
        for prompts in (COURSE_PROMPTS, SECOND_PROMPTS, SECOND_PROMPTS):
            _catch(lambda p=prompts: adapter.run_generate(fresh, tokenizer, p, cached))
        switch, _ = adapter_load.build_from_checkpoint(obs.pkg, settings("switch", False, obs.ckpt))

        def texts(model: Any, prompts: list[str], run: dict[str, Any]) -> Any:
            return _catch(lambda: adapter.run_generate(model, tokenizer, prompts, run)["texts"])

        return {
            "after": texts(fresh, SECOND_PROMPTS, plain),
            "on": texts(switch, COURSE_PROMPTS, cached),
            "back": texts(switch, SECOND_PROMPTS, plain),
        }

    out["mode_switch"] = _catch(switches)
    out["top_p"] = _catch(lambda: top_p_sets(obs.pkg))
    if contents is not None:  # last: its calls leave the cached model's state behind
        out["cache_contents"] = _catch(lambda: cache_observation(obs, *contents))
    return out


def top_p_sets(pkg: dict[str, ModuleType]) -> list[list[int]]:
    """The tokens ``sample_top_p`` ever draws for each row of the probe distribution."""
    draws = adapter.run_sample_top_p(pkg, np.array(TOP_P_PROBS, dtype=np.float32), TOP_P, 400)
    return [sorted(set(row.tolist())) for row in draws]


def rope_checkpoint(files: dict[str, bytes], dest: Path, scaled: bool) -> Path:
    """The tiny checkpoint written to ``dest``, its params.json saying ``scaled``."""
    dest.mkdir(parents=True)
    for name, data in files.items():
        (dest / name).write_bytes(data)
    params = json.loads((dest / "params.json").read_text())
    (dest / "params.json").write_text(json.dumps({**params, "use_scaled_rope": scaled}))
    return dest


def build(
    reference_root: Path, mutant_roots: dict[str, Path], diagnoses: dict[str, str]
) -> dict[str, tuple[str | None, Any]]:
    """Every Part 3 file: relative path -> (schema name or None, JSON document or bytes).

    Every expected value exists twice: for RoPE with Llama 3.2's frequency scaling (the
    checkpoints' ``use_scaled_rope``) and, under ``unscaled_rope``, for plain RoPE (the
    course's code, whose ``ModelArgs`` has no such field); the grader judges a
    submission by the convention its cache-free logits follow."""
    reference = import_llama(reference_root)
    files = checkpoint_files("public", tokenizer_bytes(reference), VOCAB)
    out: dict[str, tuple[str | None, Any]] = {
        f"public/{CKPT}/{name}": (None, data) for name, data in files.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        ref = Observer(reference, rope_checkpoint(files, Path(tmp) / "scaled", True))
        plain = Observer(reference, rope_checkpoint(files, Path(tmp) / "plain", False))
        rng = np.random.default_rng(31337)
        enc = [ref.tokenizer.encode(p, bos=True, eos=False) for p in COURSE_PROMPTS]
        probe_tokens = np.array([enc[3]], dtype=np.int64)
        cases = [forward_case("public", np.array([t], dtype=np.int64), ref, rng) for t in enc]
        cases.append(forward_case("public", rng.integers(0, VOCAB, (3, 37)), ref, rng))
        hidden = [
            forward_case("hidden", rng.integers(0, VOCAB, (b, n)), ref, rng)
            for b, n in ((3, 40), (2, MAX_SEQ_LEN), (4, 23))
        ]
        capacity = capacity_case(ref)
        cached = {"scaled": ref.models["public", True], "unscaled": plain.models["public", True]}
        ids, layers = reference_probe(cached, VOCAB)
        for case in [*cases, *hidden, capacity]:
            case["expected_unscaled"] = expected_of(plain, case)
        public, secret = (
            convention(obs, reference, mutant_roots, probe_tokens, (ids, layers[rope]))
            for rope, obs in (("scaled", ref), ("unscaled", plain))
        )
    public_doc = {
        "part": "part3",
        "version": 1,
        "atol": ATOL,
        "checkpoint": CKPT,
        "max_seq_len": MAX_SEQ_LEN,
        "max_batch_size": MAX_BATCH,
        "bos_id": ref.tokenizer.special_tokens["<|begin_of_text|>"],
        "generate": {**GENERATE, "prompts": COURSE_PROMPTS, "second_prompts": SECOND_PROMPTS},
        **public[0],
        "unscaled_rope": secret[0],
        "probe_tokens": probe_tokens.tolist(),
        # Where the hidden pools are absent, every timed run takes the prompt of its length.
        "benchmark_prompts": {
            str(n): benchmark_prompt(ref.tokenizer, n)
            for n in (GROWTH_PROMPT, WORK_PROMPT, 64, 128, 256)
        },
        "diagnoses": diagnoses,
        "token_texts": token_texts(ref, VOCAB),
        "models": {"public": model_entry("public")},
        "cases": [*({**c, "check": "3.2"} for c in cases), capacity],
    }
    out["public/part3.json"] = ("part3_cases", public_doc)
    hidden_doc = {
        "part": "part3",
        "version": 1,
        "models": {"hidden": model_entry("hidden")},
        **public[1],
        "unscaled_rope_hidden": secret[1],
        "cases": [{**c, "check": "3.4"} for c in hidden],
    }
    out["hidden/part3.json"] = ("part3_cases", hidden_doc)
    out[CACHE_FILE] = (None, probe_document(ids, layers))  # no values the schema knows
    return out


def convention(
    obs: Observer,
    reference: dict[str, ModuleType],
    mutant_roots: dict[str, Path],
    probe_tokens: np.ndarray,
    contents: Contents = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The public and the hidden values that depend on the RoPE convention of ``obs``
    (texts, batches, probes, the mutants' signatures, the timed prompt pools)."""
    expected = probes(obs, probe_tokens, contents)
    hidden_texts = {c: obs.generate("hidden", HIDDEN_PROMPTS, c)["texts"] for c in (True, False)}
    assert hidden_texts[True] == hidden_texts[False], "reference: cached and cache-free differ"
    public = {
        "expected_texts": expected["generate_cached"],
        "expected_second": expected["second_call"],
        "full_generate": full_batch(obs),
        "stop_generate": stop_batch(obs),
        "sampling": sampling_probe(obs),
        "signatures": mutant_signatures(mutant_roots, obs.ckpt, probe_tokens, expected, contents),
    }
    hidden = {
        "hidden_generate": {
            "prompts": HIDDEN_PROMPTS,
            "expected_texts": hidden_texts[True],
            "stop": stop_batch(obs, "hidden", HIDDEN_STOP_SEED),
        },
        "bench_pools": bench_pools(reference, settings("bench", True, obs.ckpt)),
    }
    return public, hidden


def expected_of(obs: Observer, case: dict[str, Any]) -> dict[str, Any]:
    """``case``'s expected logits from ``obs`` (the same tokens and positions)."""
    tokens = np.array(case["tokens"], dtype=np.int64)
    logits = obs.forward(case["model"], tokens, "no_cache")
    return encode_array(logits[:, case["positions"], :])


def mutant_signatures(
    mutant_roots: dict[str, Path],
    ckpt: Path,
    probe_tokens: np.ndarray,
    expected: dict[str, Any],
    contents: Contents = None,
) -> dict[str, dict[str, Any]]:
    """What each known mistake answers to the probes, where it differs from the reference:
    probe key -> mutant name -> its answer (the diagnosis catalogue's fingerprints)."""
    signatures: dict[str, dict[str, Any]] = {key: {} for key in expected}
    for name, root in mutant_roots.items():
        try:
            seen = probes(Observer(import_llama(root), ckpt), probe_tokens, contents)
        except Exception as exc:  # it cannot even build: named by check 3.1
            seen = {key: {"error": f"{type(exc).__name__}: {exc}"[:2000]} for key in expected}
        for key, value in seen.items():
            if json.dumps(value) != json.dumps(expected[key]):
                signatures[key][name] = value
    return signatures


def capacity_case(ref: Observer) -> dict[str, Any]:
    """Check 3.1's capacity probe: ``max_batch_size`` rows of ``max_seq_len`` seeded tokens,
    compared at the end of the prefill, the first decode step and the last two cache slots
    (the cached plan: prefill, then one token per call)."""
    tokens = np.random.default_rng(CAPACITY_SEED).integers(0, VOCAB, (MAX_BATCH, MAX_SEQ_LEN))
    logits = ref.forward("public", tokens, "no_cache")
    cached = ref.forward("public", tokens, "cached")
    assert np.abs(cached - logits).max() <= ATOL / 10, "reference: cached and cache-free differ"
    k = plans(MAX_SEQ_LEN)["cached"][0][1]
    positions = [k - 1, k, MAX_SEQ_LEN - 2, MAX_SEQ_LEN - 1]
    return {
        "check": "3.1",
        "label": f"public model, batch {MAX_BATCH} (max_batch_size), {MAX_SEQ_LEN} tokens "
        "(max_seq_len)",
        "model": "public",
        "tokens": tokens.tolist(),
        "positions": positions,
        "expected": encode_array(logits[:, positions, :]),
    }


def model_entry(name: str) -> dict[str, Any]:
    params, seed = MODELS[name]
    return {
        "params": params,
        "seed": seed,
        "vocab_size": VOCAB,
        "weights_sha256": digest(make_weights(params, VOCAB, seed)),
    }


def forward_case(
    model: str, tokens: np.ndarray, ref: Observer, rng: np.random.Generator
) -> dict[str, Any]:
    """One forward case: tokens, compared positions, and the reference's logits there."""
    tokens = np.asarray(tokens, dtype=np.int64)
    length = tokens.shape[1]
    logits = ref.forward(model, tokens, "no_cache")
    chosen = {0, length - 1, *(int(p) for p in rng.integers(0, length, POSITIONS))}
    positions = sorted(chosen)[:POSITIONS] if length > POSITIONS else list(range(length))
    if length - 1 not in positions:
        positions[-1] = length - 1
    return {
        "label": f"{model} model, batch {tokens.shape[0]}, {length} tokens",
        "model": model,
        "tokens": tokens.tolist(),
        "positions": positions,
        "expected": encode_array(logits[:, positions, :]),
    }
