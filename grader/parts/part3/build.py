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
from grader.parts.part3 import adapter
from grader.parts.part3.build_pools import bench_pools
from grader.parts.part3.cases import (
    ATOL,
    CAPACITY_SEED,
    COURSE_PROMPTS,
    FULL_SEED,
    GROWTH_PROMPT,
    MODELS,
    N_RANKS,
    POOL_MIN_GAP,
    SAMPLE_PROMPT,
    STOP_NEW,
    STOP_PROMPT,
    STOP_SEED,
    TOP_P,
    TOP_P_PROBS,
    WORK_PROMPT,
    benchmark_prompt,
    checkpoint_files,
    make_weights,
    plain_words,
    plans,
    sampling_case,
    words_prompt,
)

CKPT = "part3/tiny_llama"
VOCAB = N_RANKS + 256
MAX_SEQ_LEN, MAX_BATCH = 128, 4
POSITIONS = 6
GENERATE = {"max_gen_len": 16, "temperature": 0.0, "top_p": 0.9, "seed": 0}
SECOND_PROMPTS = ["Hello", "The capital of France is"]
HIDDEN_PROMPTS = ["Once upon a time", "def fibonacci(n):", "Les sanglots longs des violons"]
# Check 3.5's full batch: one prompt per cache row, the longest filling every position.
FULL_LENGTHS = (MAX_SEQ_LEN, MAX_SEQ_LEN - 8, 57, 23)


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


def settings(name: str, kv_caching: bool, ckpt_dir: Path | None = None) -> dict[str, Any]:
    params, _ = MODELS.get(name, MODELS["public"])
    out: dict[str, Any] = {
        "model": name,
        "params": params,
        "vocab_size": VOCAB,
        "max_seq_len": MAX_SEQ_LEN,
        "max_batch_size": MAX_BATCH,
        "kv_caching": kv_caching,
    }
    if ckpt_dir is not None:
        out.update(ckpt_dir=str(ckpt_dir), tokenizer_path=str(ckpt_dir / "tokenizer.model"))
    return out


class Observer:
    """A package's models (cached and cache-free) on the public and hidden weights."""

    def __init__(self, pkg: dict[str, ModuleType], ckpt_dir: Path) -> None:
        self.pkg = pkg
        self.ckpt = ckpt_dir
        self.models: dict[tuple[str, bool], Any] = {}
        for cache in (True, False):
            model, self.tokenizer = adapter.build_from_checkpoint(
                pkg, settings("public", cache, ckpt_dir)
            )
            self.models["public", cache] = model
            params, seed = MODELS["hidden"]
            weights = make_weights(params, VOCAB, seed)
            self.models["hidden", cache] = adapter.build_from_arrays(
                pkg, settings("hidden", cache), weights
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


def probes(obs: Observer, tokens: np.ndarray) -> dict[str, Any]:
    """What a package shows on each diagnostic probe (plain JSON values)."""
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
        fresh, tokenizer = adapter.build_from_checkpoint(obs.pkg, settings("fresh", True, obs.ckpt))
        run = {**GENERATE, "kv_caching": True}
        adapter.run_generate(fresh, tokenizer, COURSE_PROMPTS, run)
        first = adapter.run_generate(fresh, tokenizer, SECOND_PROMPTS, run)["texts"]
        again = _catch(lambda: adapter.run_generate(fresh, tokenizer, SECOND_PROMPTS, run)["texts"])
        return first if again == first else {"repeat_differs": True}

    out["second_call"] = _catch(second)

    def switches() -> dict[str, Any]:  # as check 3.8 does after its second-call probe
        fresh, tokenizer = adapter.build_from_checkpoint(obs.pkg, settings("fresh", True, obs.ckpt))
        cached, plain = {**GENERATE, "kv_caching": True}, {**GENERATE, "kv_caching": False}
        for prompts in (COURSE_PROMPTS, SECOND_PROMPTS, SECOND_PROMPTS):
            _catch(lambda p=prompts: adapter.run_generate(fresh, tokenizer, p, cached))
        switch, _ = adapter.build_from_checkpoint(obs.pkg, settings("switch", False, obs.ckpt))

        def texts(model: Any, prompts: list[str], run: dict[str, Any]) -> Any:
            return _catch(lambda: adapter.run_generate(model, tokenizer, prompts, run)["texts"])

        return {
            "after": texts(fresh, SECOND_PROMPTS, plain),
            "on": texts(switch, COURSE_PROMPTS, cached),
            "back": texts(switch, SECOND_PROMPTS, plain),
        }

    out["mode_switch"] = _catch(switches)
    out["top_p"] = _catch(lambda: top_p_sets(obs.pkg))
    return out


def sampling_probe(ref: Observer) -> dict[str, Any]:
    """Check 3.10's temperature probe, from the reference's logits for its prompt."""
    tok = ref.tokenizer
    ids = np.array([tok.encode(SAMPLE_PROMPT, bos=True, eos=False)], dtype=np.int64)
    logits = ref.forward("public", ids, "no_cache")[0, -1]  # (vocab,)
    text_of = ["" if i in tok.stop_tokens else tok.decode([i]) for i in range(logits.shape[0])]
    return sampling_case(logits, text_of)


def top_p_sets(pkg: dict[str, ModuleType]) -> list[list[int]]:
    """The tokens ``sample_top_p`` ever draws for each row of the probe distribution."""
    draws = adapter.run_sample_top_p(pkg, np.array(TOP_P_PROBS, dtype=np.float32), TOP_P, 400)
    return [sorted(set(row.tolist())) for row in draws]


def build(
    reference_root: Path, mutant_roots: dict[str, Path], diagnoses: dict[str, str]
) -> dict[str, tuple[str | None, Any]]:
    """Every Part 3 file: relative path -> (schema name or None, JSON document or bytes)."""
    reference = import_llama(reference_root)
    files = checkpoint_files("public", tokenizer_bytes(reference), VOCAB)
    out: dict[str, tuple[str | None, Any]] = {
        f"public/{CKPT}/{name}": (None, data) for name, data in files.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp)
        for name, data in files.items():
            (ckpt / name).write_bytes(data)
        ref = Observer(reference, ckpt)
        rng = np.random.default_rng(31337)
        enc = [ref.tokenizer.encode(p, bos=True, eos=False) for p in COURSE_PROMPTS]
        probe_tokens = np.array([enc[3]], dtype=np.int64)
        cases = [forward_case("public", np.array([t], dtype=np.int64), ref, rng) for t in enc]
        cases.append(forward_case("public", rng.integers(0, VOCAB, (3, 37)), ref, rng))
        hidden = [
            forward_case("hidden", rng.integers(0, VOCAB, (b, n)), ref, rng)
            for b, n in ((3, 40), (2, MAX_SEQ_LEN), (4, 23))
        ]
        expected = probes(ref, probe_tokens)
        signatures = mutant_signatures(mutant_roots, ckpt, probe_tokens, expected)
        hidden_texts = {
            c: ref.generate("hidden", HIDDEN_PROMPTS, c)["texts"] for c in (True, False)
        }
        sampling = sampling_probe(ref)
        capacity = capacity_case(ref)
        full = full_batch(ref)
        stop = stop_batch(ref)
        pools = bench_pools(reference, settings("bench", True, ckpt))
    assert hidden_texts[True] == hidden_texts[False], "reference: cached and cache-free differ"
    public = {
        "part": "part3",
        "version": 1,
        "atol": ATOL,
        "checkpoint": CKPT,
        "max_seq_len": MAX_SEQ_LEN,
        "max_batch_size": MAX_BATCH,
        "generate": {**GENERATE, "prompts": COURSE_PROMPTS, "second_prompts": SECOND_PROMPTS},
        "expected_texts": expected["generate_cached"],
        "expected_second": expected["second_call"],
        "full_generate": full,
        "stop_generate": stop,
        "probe_tokens": probe_tokens.tolist(),
        "sampling": sampling,
        # Where the hidden pools are absent, every timed run takes the prompt of its length.
        "benchmark_prompts": {
            str(n): benchmark_prompt(ref.tokenizer, n)
            for n in (GROWTH_PROMPT, WORK_PROMPT, 64, 128, 256)
        },
        "diagnoses": diagnoses,
        "signatures": signatures,
        "models": {"public": model_entry("public")},
        "cases": [*({**c, "check": "3.2"} for c in cases), capacity],
    }
    out["public/part3.json"] = ("part3_cases", public)
    out["hidden/part3.json"] = ("part3_cases", hidden_document(hidden_texts[True], pools, hidden))
    return out


def mutant_signatures(
    mutant_roots: dict[str, Path],
    ckpt: Path,
    probe_tokens: np.ndarray,
    expected: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """What each known mistake answers to the probes, where it differs from the reference:
    probe key -> mutant name -> its answer (the diagnosis catalogue's fingerprints)."""
    signatures: dict[str, dict[str, Any]] = {key: {} for key in expected}
    for name, root in mutant_roots.items():
        try:
            seen = probes(Observer(import_llama(root), ckpt), probe_tokens)
        except Exception as exc:  # it cannot even build: named by check 3.1
            seen = {key: {"error": f"{type(exc).__name__}: {exc}"[:2000]} for key in expected}
        for key, value in seen.items():
            if json.dumps(value) != json.dumps(expected[key]):
                signatures[key][name] = value
    return signatures


def hidden_document(texts: list[str], pools: Any, cases: list[dict]) -> dict[str, Any]:
    """The hidden Part 3 file: its model, greedy texts, timed prompt pools and cases."""
    return {
        "part": "part3",
        "version": 1,
        "models": {"hidden": model_entry("hidden")},
        "hidden_generate": {"prompts": HIDDEN_PROMPTS, "expected_texts": texts},
        "bench_pools": pools,
        "cases": [{**c, "check": "3.4"} for c in cases],
    }


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


def full_batch(ref: Observer) -> dict[str, Any]:
    """Check 3.5's full batch: ``max_batch_size`` seeded prompts of ``FULL_LENGTHS`` tokens,
    the longest exactly ``max_seq_len`` (Meta's guard refuses only longer ones), so the
    loop runs to the last cache slot; every greedy step of a generating row wins clearly."""
    rng = np.random.default_rng(FULL_SEED)
    words = plain_words(ref.tokenizer)
    for _ in range(50):
        prompts = [words_prompt(ref.tokenizer, words, n, rng) for n in FULL_LENGTHS]
        runs = {cache: ref.generate("public", prompts, cache) for cache in (True, False)}
        top2 = np.sort(runs[True]["step_logits"], axis=-1)[..., -2:]  # (steps, B, 2)
        cur_pos = min(FULL_LENGTHS) + np.arange(top2.shape[0])[:, None]  # (steps, 1)
        generating = cur_pos >= np.array(FULL_LENGTHS)[None, :]
        gaps = (top2[..., 1] - top2[..., 0])[generating]
        if runs[True]["texts"] == runs[False]["texts"] and gaps.min() >= POOL_MIN_GAP:
            return {
                "prompts": prompts,
                "prompt_tokens": list(FULL_LENGTHS),
                "max_gen_len": GENERATE["max_gen_len"],
                "expected_texts": runs[True]["texts"],
            }
    raise RuntimeError("no full batch whose greedy steps all win clearly")


def stop_batch(ref: Observer) -> dict[str, Any]:
    """Check 3.5's stop batch: two seeded prompts, the first one's greedy continuation
    reaching one of the tokenizer's stop tokens (the text must end there), the second one
    not; every greedy step up to a row's stop wins clearly."""
    rng = np.random.default_rng(STOP_SEED)
    words = plain_words(ref.tokenizer)
    stops = set(ref.tokenizer.stop_tokens)
    for _ in range(400):
        prompts = [words_prompt(ref.tokenizer, words, STOP_PROMPT, rng) for _ in range(2)]
        run = ref.generate("public", prompts, True, max_gen_len=STOP_NEW)
        logits = run["step_logits"]  # (steps, B, vocab)
        chosen = logits.argmax(axis=-1)  # (steps, B)
        hits = [np.flatnonzero(np.isin(chosen[:, b], list(stops))) for b in range(2)]
        if not (len(hits[0]) and hits[0][0] < len(chosen) - 1 and not len(hits[1])):
            continue
        top2 = np.sort(logits, axis=-1)[..., -2:]  # (steps, B, 2)
        gaps = top2[..., 1] - top2[..., 0]  # (steps, B)
        if gaps[: hits[0][0] + 1, 0].min() < POOL_MIN_GAP or gaps[:, 1].min() < POOL_MIN_GAP:
            continue
        plain = ref.generate("public", prompts, False, max_gen_len=STOP_NEW)
        if plain["texts"] == run["texts"]:
            return {
                "prompts": prompts,
                "prompt_tokens": [STOP_PROMPT, STOP_PROMPT],
                "max_gen_len": STOP_NEW,
                "expected_texts": run["texts"],
            }
    raise RuntimeError("no seeded prompt whose greedy continuation reaches a stop token")


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
