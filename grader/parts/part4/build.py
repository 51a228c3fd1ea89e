"""Part 4 data: the small GPT-2 models the lab is graded on, public and hidden prompts,
the reference's tokens and per-step logits (built by ``regen`` through the adapter),
``theoretical_kv_bytes`` inputs, the int8 bonus's fp32 cache with the tokens that follow
it, and the latency check's prompts with the reference's tokens. Checks 4.2-4.4 and 4.6
run every case they find: the public ones in a student's self-check, public and hidden
ones on Gradescope."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from grader.core.arrays import encode_array
from grader.parts.part4 import adapter
from grader.parts.part4.pools import MARGIN, PROMPT_LEN, min_gap, runs_per_grading

ATOL = 2e-3  # float32 logits; thread counts change the order of the sums
NEW_TOKENS = 16
LAB_MODEL = {
    "config": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 512},
    "seed": 404,
}
HIDDEN_MODEL = {
    "config": {"n_layer": 3, "n_embd": 96, "n_head": 6, "vocab_size": 640, "n_positions": 384},
    "seed": 505,
}
SEED = 2718
PUBLIC_SEED = 1414  # the public cases' own stream, so the hidden ones do not change
BENCH_SEED = 3141  # the latency prompts' streams (public, hidden)
BENCH_NEW_TOKENS = 256  # the longest L of every thresholds profile
INT8_PROMPT = (np.arange(3, 67, dtype=np.int64)[None, :] % 500).tolist()  # 64 tokens
INT8_NEW_TOKENS = 64
INT8_CACHE_SEED = 1616  # the made-up float16 cache of the int8 round trip
INT8_CACHE_SHAPE = (1, 2, 6, 4)  # (batch, heads, tokens, head_dim): ±127 is 1 value in 4


def generation_cases(
    reference: ModuleType,
    rng: np.random.Generator,
    shapes: tuple[tuple[str, dict[str, Any], int, int], ...] = (
        ("lab", LAB_MODEL, 2, 8),
        ("hidden", HIDDEN_MODEL, 1, 12),
    ),
    prefix: str = "",
) -> list[dict[str, Any]]:
    """Random prompts with the reference's tokens and the logits of every cached step;
    for each, the same prompt continued by ``generate_with_cache_from`` from a cache of
    its first half."""
    cases = []
    for name, spec, batch, length in shapes:
        model = adapter.build(spec["config"], spec["seed"], on="cpu")
        ids = rng.integers(0, spec["config"]["vocab_size"], size=(batch, length))
        out = adapter.run_generate(reference, model, ids, NEW_TOKENS, cached=True)
        label = f"{prefix}{MODEL_NAMES[name]}, batch {batch}, {length}-token prompt"
        cases.append(
            {
                "check": "4.2",
                "label": label,
                "model": name,
                "ids": ids.tolist(),
                "tokens": out["tokens"].tolist(),
                "step_logits": encode_array(out["step_logits"]),
            }
        )
        half = length // 2
        out = adapter.run_generate(reference, model, ids, NEW_TOKENS, True, cached_prefix=half)
        cases.append(
            {
                "check": "4.2",
                "label": f"{label} continued from a cache of its first {half}",
                "model": name,
                "ids": ids.tolist(),
                "cached_prefix": half,
                "tokens": out["tokens"].tolist(),
                "step_logits": encode_array(out["step_logits"]),
            }
        )
    return cases


def theory_cases(
    reference: ModuleType,
    rng: np.random.Generator,
    n: int = 8,
    n_default: int = 2,
    mutants: dict[str, ModuleType] | None = None,
) -> list[dict[str, Any]]:
    """Random ``(L, D, n_layers, bytes)`` with the reference's byte count; then
    ``n_default`` cases of ``(L, D, n_layers)`` alone, for the signature's default
    ``bytes_per_elem=2`` (fp16, the lab's formula). Each case also holds the value of
    every mutant that returns another one (``mistakes``), so check 4.4 can name it."""
    cases = []
    for i in range(n + n_default):
        args = [
            int(rng.integers(1, 8193)),  # L
            int(rng.choice([64, 768, 2048, 4096])),  # D
            int(rng.integers(1, 49)),  # n_layers
        ]
        if i < n:
            args.append(int(rng.choice([1, 2, 4])))  # bytes per element
        expected = int(reference.theoretical_kv_bytes(*args))
        case: dict[str, Any] = {"check": "4.4", "args": args, "expected": expected}
        mistakes = theory_mistakes(mutants or {}, args, expected)
        if mistakes:
            case["mistakes"] = mistakes
        cases.append(case)
    return cases


def theory_mistakes(mutants: dict[str, ModuleType], args: list[int], expected: int) -> dict:
    """Mutant name -> what its ``theoretical_kv_bytes(*args)`` returns, where that is an
    int other than ``expected`` (a mutant that raises or agrees is left out)."""
    out = {}
    for name, mod in mutants.items():
        try:
            value = mod.theoretical_kv_bytes(*args)
        except Exception:
            continue
        if isinstance(value, int) and value != expected:
            out[name] = value
    return out


def bench_prompts() -> int:
    """Timed runs of check 4.6 in one grading at most, under every thresholds profile whose
    pool ``regen`` builds (one with a model of its own is built in the grading)."""
    from grader.core.thresholds import DEVICES, load_thresholds

    benches = [load_thresholds(device)["part4"] for device in DEVICES]
    return max(runs_per_grading(b) for b in benches if "model" not in b)


def latency_cases(reference: ModuleType, seed: int, prefix: str) -> list[dict[str, Any]]:
    """Prompts for the timed runs of 4.6 (a fresh one per run), each with the
    reference's 256 greedy tokens on the lab model (a shorter L must give their first
    L); prompts whose greedy steps come near a tie are skipped."""
    model = adapter.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu")
    rng = np.random.default_rng(seed)
    cases: list[dict[str, Any]] = []
    while len(cases) < bench_prompts():
        ids = rng.integers(0, LAB_MODEL["config"]["vocab_size"], size=(1, PROMPT_LEN))
        out = adapter.run_generate(reference, model, ids, BENCH_NEW_TOKENS, cached=True)
        gap = min_gap(out["step_logits"])
        if gap <= MARGIN:
            continue
        cases.append(
            {
                "check": "4.6",
                "label": f"{prefix}timed prompt {len(cases) + 1}",
                "model": "lab",
                "ids": ids.tolist(),
                "tokens": out["tokens"].tolist(),
                "min_gap": round(gap, 4),  # regen --check recomputes it with the tokens
            }
        )
    return cases


def int8_case(reference: ModuleType) -> dict[str, Any]:
    """The fp32 cache of the int8 prompt's first 63 tokens on the lab model, layer by
    layer, and the reference's greedy tokens continuing from it: the parent sizes and
    checks the student's quantisation against these, never against worker figures."""
    model = adapter.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu")
    ids = np.array(INT8_PROMPT, dtype=np.int64)
    cache = adapter.real_cache(model, ids[:, :-1], "float32")
    pairs = adapter.cache_tensors(cache)
    tokens = adapter.greedy_from(model, adapter.as_ids(model, ids), cache, INT8_NEW_TOKENS)
    return {
        "check": "4.7",
        "label": "int8 cache of a 64-token prompt",
        "model": "lab",
        "ids": INT8_PROMPT,
        "cache": [encode_array(t.numpy()) for k, v in pairs for t in (k, v)],
        "tokens": tokens.numpy().tolist(),
    }


def int8_cache_case(seed: int = INT8_CACHE_SEED) -> dict[str, Any]:
    """A float16 cache made up for the int8 round trip: 2 layers of (1, 2, 6, 4) keys and
    values. Every vector is scale x u with scale a power of 2 and u whole or a quarter
    off (never a half, so rounding has no ties, in float16 or float32 alike) and one
    entry exactly ±127 (its sign alternating), so the clamp's ends are a quarter of the
    values; a few vectors are all zeros (scale 0 unless guarded). Stored as float32,
    which holds every value exactly; the check sends them as float16."""
    rng = np.random.default_rng(seed)
    shape = INT8_CACHE_SHAPE
    cache = []
    for t in range(4):  # k0, v0, k1, v1
        u = rng.integers(-126, 127, size=shape) + rng.choice([0, 0.25, 0.75, -0.25, -0.75], shape)
        u = np.clip(u, -126.75, 126.75)
        vectors = u.reshape(-1, shape[-1])
        at = rng.integers(0, shape[-1], size=len(vectors))
        vectors[np.arange(len(vectors)), at] = np.where(np.arange(len(vectors)) % 2 == t % 2,
                                                        127.0, -127.0)  # fmt: skip
        scale = 2.0 ** rng.integers(-6, 3, size=(*shape[:-1], 1))
        x = vectors.reshape(shape) * scale
        for b, h, tok in ((0, t % 2, t), (0, (t + 1) % 2, 5 - t)):
            x[b, h, tok] = 0.0  # all-zero vectors
        x16 = x.astype(np.float16)
        assert (x16.astype(np.float64) == x).all(), "every value must be exact in float16"
        cache.append(encode_array(x16.astype(np.float32)))
    return {
        "check": "4.7",
        "label": "a float16 cache with all-zero vectors and 4 values per vector",
        "dtype": "float16",
        "cache": cache,
    }


def build(reference: ModuleType, mutants: dict[str, ModuleType], diagnoses: dict[str, str]) -> dict:
    """Part 4's files: relative path -> (schema name, document)."""
    rng = np.random.default_rng(SEED)
    hidden = {
        "part": "part4",
        "version": 1,
        "cases": generation_cases(reference, rng, prefix="hidden prompt, ")
        + theory_cases(reference, rng, mutants=mutants)
        + latency_cases(reference, BENCH_SEED + 1, "hidden "),
    }
    public = {
        "part": "part4",
        "version": 1,
        "atol": ATOL,
        "new_tokens": NEW_TOKENS,
        "models": {"lab": LAB_MODEL, "hidden": HIDDEN_MODEL},
        "diagnoses": diagnoses,
        "signatures": signatures(reference, mutants),
        "cases": public_cases(reference, mutants),
    }
    return {
        "public/part4.json": ("part4_cases", public),
        "hidden/part4.json": ("part4_cases", hidden),
    }


#: How case labels call the two models: the second one's weights and sizes are public
#: (the self-check runs it), so it is not called "hidden" there.
MODEL_NAMES = {"lab": "lab model", "hidden": "second model (other sizes)"}


def public_cases(
    reference: ModuleType, mutants: dict[str, ModuleType] | None = None
) -> list[dict[str, Any]]:
    """The self-check's counterparts of the hidden cases: other prompts on the same two
    models and other ``theoretical_kv_bytes`` inputs, judged with the same messages;
    the latency prompts and the int8 cases."""
    rng = np.random.default_rng(PUBLIC_SEED)
    shapes = (("lab", LAB_MODEL, 1, 6), ("hidden", HIDDEN_MODEL, 2, 5))
    return (
        generation_cases(reference, rng, shapes, prefix="public prompt, ")
        + theory_cases(reference, rng, n=4, mutants=mutants)
        + latency_cases(reference, BENCH_SEED, "public ")
        + [int8_case(reference), int8_cache_case()]
    )


def signatures(reference: ModuleType, mutants: dict[str, ModuleType]) -> dict[str, dict]:
    """What each mutant shows on the generation probe, where it differs from the reference."""
    model = adapter.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu")
    ids = np.arange(1, 9, dtype=np.int64)[None, :]

    def observe(mod: ModuleType) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        try:
            out = adapter.run_generate(mod, model, ids, 8, cached=True)
            seen["cached_lengths"] = out["lengths"]
            seen["cached_use_cache"] = out["use_cache"]
            seen["cached_past"] = out["past_given"]
            seen["cached_tokens"] = out["tokens"].tolist()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            for key in ("cached_lengths", "cached_use_cache", "cached_past", "cached_tokens"):
                seen[key] = error
        return seen

    expected = observe(reference)
    table: dict[str, dict] = {key: {} for key in expected}
    for name, mod in mutants.items():
        for key, value in observe(mod).items():
            if value != expected[key]:
                table[key][name] = value
    return table
