"""Building Part 2's case files from the reference and its mutants (``regen`` only)."""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import numpy as np

from grader.core.arrays import encode_array, fingerprint, weights_digest
from grader.parts.part2 import adapter
from grader.parts.part2.build_pools import bench_pools
from grader.parts.part2.cases import (
    ABLATIONS,
    ATOL,
    CACHE_PROBE_PREFILL,
    CACHED_MODES,
    HIDDEN_MODEL,
    HIDDEN_SEED,
    ONE_LAYER_MODEL,
    PUBLIC_MODEL,
    PUBLIC_SEED,
    SAMPLE_CALLS,
    SAMPLE_ROWS,
    SAMPLE_SEED,
    SAMPLE_SIGMAS,
    ablate,
    chunk_plan,
    frequency_band,
    make_state_dict,
    probe_steps,
    random_ids,
    softmax64,
    top2_gap,
    torch_state_dict_bytes,
)

MODES = ("no_cache", "full_cache", "sequential", "chunks")
N_PUBLIC = 10
POSITIONS_PER_CASE = 8

# Hidden cases: (check, model, batch, length, plan). A plan is None (no cache),
# "full", "sequential" or a (prefill, chunk) pair.
# Lengths reach each model's max_seq_len (128 for the public one, 320 for the hidden).
HIDDEN_PLANS: list[tuple[str, str, int, int, Any]] = [
    ("2.6", "hidden", 3, 40, None),
    ("2.6", "hidden", 2, 320, None),
    ("2.6", "public", 4, 64, None),
    ("2.6", "public", 1, 128, None),
    ("2.7", "hidden", 3, 40, "sequential"),
    ("2.7", "hidden", 2, 320, (100, 7)),
    ("2.7", "hidden", 2, 57, "full"),
    ("2.7", "public", 2, 128, "sequential"),
    ("2.7", "public", 3, 90, (31, 5)),
    ("2.7", "public", 1, 128, (120, 1)),
    ("2.7", "one_layer", 2, 40, "sequential"),
    ("2.7", "one_layer", 3, 64, (20, 5)),
]


def model_entry(spec: dict[str, Any]) -> dict[str, Any]:
    return {**spec, "weights_sha256": weights_digest(make_state_dict(spec))}


def _plan_steps(plan: Any, length: int) -> list[int] | None:
    if plan is None:
        return None
    if plan == "full":
        return [length]
    if plan == "sequential":
        return [1] * length
    prefill, chunk = plan
    return chunk_plan(length, prefill, chunk)


def _positions(rng: np.random.Generator, length: int, steps: list[int] | None) -> list[int]:
    """Positions compared in a hidden case: both ends, chunk starts, and random ones."""
    chosen = {0, length - 1}
    if steps:
        chosen.update(int(s) for s in np.cumsum(steps)[:-1][:3])
    while len(chosen) < min(POSITIONS_PER_CASE, length):
        chosen.add(int(rng.integers(0, length)))
    return sorted(chosen)


def _greedy_prompt(reference: Any, rng: np.random.Generator, vocab: int) -> list[list[int]]:
    """A prompt whose greedy continuation has a clear winner at every step, so
    sampling at a very low temperature must reproduce it."""
    for _ in range(200):
        ids = random_ids(rng, vocab, 1, 8)
        for _ in range(4):
            logits = adapter.run_forward(reference, ids, None)["logits"]
            if top2_gap(logits[:, -1:, :]) < 0.3:
                break
            ids = np.concatenate([ids, logits[:, -1:, :].argmax(-1)], axis=1)
        else:
            return ids[:, :8].tolist()
    raise RuntimeError("no prompt with a clear greedy continuation found")


def course_cases(reference: Any, rng: np.random.Generator, vocab: int) -> list[dict[str, Any]]:
    """The public ``test_cases.json`` in the course skeleton's format."""
    cases = []
    for _ in range(N_PUBLIC):
        ids = random_ids(rng, vocab, 1, int(rng.integers(6, 17)))
        length = ids.shape[1]
        expected = {
            "expected_logits_no_cache": adapter.run_forward(reference, ids, None)["logits"],
            "expected_logits_with_cache": adapter.run_forward(reference, ids, [length])["logits"],
            "expected_logits_sequential": adapter.run_forward(reference, ids, [1] * length)[
                "logits"
            ],
        }
        case: dict[str, Any] = {"input_ids": ids.tolist()}
        case.update({k: np.round(v.astype(float), 4).tolist() for k, v in expected.items()})
        cases.append(case)
    return cases


def sampling_probe(reference: Any) -> dict[str, Any]:
    """Check 2.10's sampling probe: a seeded prompt whose likeliest next token has a
    probability the draws can tell from what sampling at temperature 2, or from
    softmax(floor(logits / T)), would give (regen refuses a probe that cannot)."""
    rng = np.random.default_rng(SAMPLE_SEED)
    n = SAMPLE_ROWS * SAMPLE_CALLS
    for _ in range(500):
        ids = random_ids(rng, PUBLIC_MODEL["config"]["vocab_size"], 1, 8)
        z = adapter.run_forward(reference, ids, None)["logits"][0, -1].astype(np.float64)
        top = int(z.argmax())
        p, floor, hot = (float(softmax64(x)[top]) for x in (z, np.floor(z), z / 2))
        band = frequency_band(p, n)
        if 0.2 <= p <= 0.8 and min(abs(p - floor), abs(p - hot)) > 2 * band:
            return {
                "prompt": ids.tolist(),
                "rows": SAMPLE_ROWS,
                "calls": SAMPLE_CALLS,
                "sigmas": SAMPLE_SIGMAS,
                "top_probability": p,
                "floor_probability": floor,
                "at_2_probability": hot,
            }
    raise RuntimeError("no sampling probe prompt found")


def catalogue(
    reference: Any,
    mutants: dict[str, Any],
    probe_ids: np.ndarray,
    probe: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """Each mutant's observable signature per probe, where it differs from the reference's."""
    signatures: dict[str, dict[str, Any]] = {mode: {} for mode in MODES}
    signatures["generate_lengths"] = {}
    signatures["generate_tokens"] = {}
    signatures["low_temperature"] = {}
    length = probe_ids.shape[1]
    low = {
        "batch": probe["low_batch"],
        "new_tokens": probe["low_new_tokens"],
        "temperature": probe["low_temperature"],
    }

    def observe(model: Any) -> dict[str, Any]:
        seen = {m: signature(model, probe_ids, probe_steps(m, length)) for m in MODES}
        try:
            cached = generate_tokens(model, probe)
            seen["generate_lengths"] = cached["forward_lengths"]
            seen["generate_tokens"] = cached["tokens"].tolist()
        except Exception as exc:
            seen["generate_lengths"] = seen["generate_tokens"] = f"{type(exc).__name__}: {exc}"
        try:
            seen["low_temperature"] = generate_tokens(model, probe, **low)["tokens"].tolist()
        except Exception as exc:
            seen["low_temperature"] = f"{type(exc).__name__}: {exc}"
        return seen

    expected = observe(reference)
    signatures["load"] = {}
    for name, model in mutants.items():
        if isinstance(model, str):  # it could not even load the weights
            signatures["load"][name] = {"error": model}
            continue
        for key, value in observe(model).items():
            if json.dumps(value) != json.dumps(expected[key]):
                signatures[key][name] = value
    return signatures


def ablation_catalogue(
    reference_module: ModuleType, mutant_modules: dict[str, ModuleType], probe_ids: np.ndarray
) -> dict[str, dict[str, Any]]:
    """Each mutant's signature in the cached modes on the public model with its positions
    or its attention switched off (``ablate``), where it differs from the reference's:
    probes ``"<mode>@<ablation>"``, on which one of two blended mistakes shows alone."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ABLATIONS:
        weights = ablate(make_state_dict(PUBLIC_MODEL), kind)
        models = {
            "reference": adapter.build_model(reference_module, PUBLIC_MODEL["config"], weights)
        }
        for name, module in mutant_modules.items():
            try:
                models[name] = adapter.build_model(module, PUBLIC_MODEL["config"], weights)
            except Exception:  # cannot load the weights: named by check 2.1
                continue
        for mode in CACHED_MODES:
            steps = probe_steps(mode, probe_ids.shape[1])
            seen = {name: signature(model, probe_ids, steps) for name, model in models.items()}
            expected = json.dumps(seen.pop("reference"))
            out[f"{mode}@{kind}"] = {n: v for n, v in seen.items() if json.dumps(v) != expected}
    return out


def build(
    reference_module: ModuleType, mutant_modules: dict[str, ModuleType], diagnoses: dict[str, str]
) -> dict[str, tuple[str | None, Any]]:
    """Every Part 2 file: relative path -> (schema name or None, JSON document or bytes)."""
    rng = np.random.default_rng(PUBLIC_SEED)
    vocab = PUBLIC_MODEL["config"]["vocab_size"]
    reference = load(reference_module, PUBLIC_MODEL)
    mutants: dict[str, Any] = {}
    for name, module in mutant_modules.items():
        try:
            mutants[name] = load(module, PUBLIC_MODEL)
        except Exception as exc:  # a mutant that cannot even load is caught by check 2.1
            mutants[name] = f"{type(exc).__name__}: {exc}"

    cases = course_cases(reference, rng, vocab)
    probe = {
        "prompt": _greedy_prompt(reference, rng, vocab),
        "batch": 2,
        "new_tokens": 8,
        "temperature": 1.0,
        "use_cache": True,
        "seed": 1234,
        "low_temperature": 0.001,
        "low_batch": 16,
        "low_new_tokens": 4,
    }
    probe_ids = np.array(cases[0]["input_ids"], dtype=np.int64)
    public = {
        "part": "part2",
        "version": 1,
        "atol": ATOL,
        "models": {"public": model_entry(PUBLIC_MODEL)},
        "course_cases": "part2/test_cases.json",
        "chunk_plans": [chunk_plan(len(c["input_ids"][0])) for c in cases],
        "generate": probe,
        "sampling": sampling_probe(reference),
        "diagnoses": diagnoses,
        "signatures": {
            **catalogue(reference, mutants, probe_ids, probe),
            **ablation_catalogue(reference_module, mutant_modules, probe_ids),
        },
        "cases": [],
    }
    return {
        "public/part2.json": ("part2_cases", public),
        "public/part2/test_cases.json": ("part2_course_cases", cases),
        "public/part2/model_state_dict.pt": (
            None,
            torch_state_dict_bytes(make_state_dict(PUBLIC_MODEL)),
        ),
        "hidden/part2.json": ("part2_cases", hidden_cases(reference_module)),
    }


def hidden_cases(reference_module: ModuleType) -> dict[str, Any]:
    """Other weights and sizes, batches, lengths up to max_seq_len, chunked decoding."""
    rng = np.random.default_rng(HIDDEN_SEED)
    specs = {"public": PUBLIC_MODEL, "hidden": HIDDEN_MODEL, "one_layer": ONE_LAYER_MODEL}
    models = {name: load(reference_module, spec) for name, spec in specs.items()}
    cases = []
    for check, model_name, batch, length, plan in HIDDEN_PLANS:
        vocab = specs[model_name]["config"]["vocab_size"]
        ids = random_ids(rng, vocab, batch, length)
        steps = _plan_steps(plan, length)
        logits = adapter.run_forward(models[model_name], ids, steps)["logits"]
        positions = _positions(rng, length, steps)
        label = f"{model_name} model, batch {batch}, {length} tokens" + (
            "" if steps is None else f", {len(steps)} cached calls"
        )
        cases.append(
            {
                "check": check,
                "label": label,
                "model": model_name,
                "input_ids": ids.tolist(),
                "steps": steps,
                "positions": positions,
                "expected": encode_array(logits[:, positions, :]),
            }
        )
    return {
        "part": "part2",
        "version": 1,
        "cache_values": cache_values_probe(models["public"], rng),
        "models": {
            "hidden": model_entry(HIDDEN_MODEL),
            "one_layer": model_entry(ONE_LAYER_MODEL),
        },
        "bench_pools": bench_pools(reference_module),
        "cases": cases,
    }


# -------------------------------------------------------------- running modules


def cache_values_probe(model: Any, rng: np.random.Generator) -> dict[str, Any]:
    """The keys and values the reference's cache holds after a prefill and single-token
    steps on the public model (check 2.11: a cache must hold K and V, not something from
    which the step recomputes them)."""
    ids = random_ids(rng, PUBLIC_MODEL["config"]["vocab_size"], 2, CACHE_PROBE_PREFILL + 2)
    steps = [CACHE_PROBE_PREFILL, 1, 1]
    arrays = adapter.run_cache_values(model, ids, steps)["arrays"]
    layers = PUBLIC_MODEL["config"]["num_layers"]
    return {
        "model": "public",
        "input_ids": ids.tolist(),
        "steps": steps,
        "k": [encode_array(arrays[f"k{i}"]) for i in range(layers)],
        "v": [encode_array(arrays[f"v{i}"]) for i in range(layers)],
    }


def _forward(model: Any, ids: np.ndarray, steps: list[int] | None) -> np.ndarray:
    return adapter.run_forward(model, ids, steps)["logits"]


def signature(model: Any, ids: np.ndarray, steps: list[int] | None) -> dict[str, Any]:
    """What a module shows on one probe: an error, nondeterminism, or a logits fingerprint."""
    try:
        first = _forward(model, ids, steps)
        second = _forward(model, ids, steps)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
    if first.shape != second.shape or not np.allclose(first, second, atol=1e-5, equal_nan=True):
        return {"nondeterministic": True}
    return {"logits": fingerprint(first)}


def generate_tokens(model: Any, probe: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """Run the seeded ``generate`` of a probe (``overrides`` replace its settings)."""
    settings = {**probe, **overrides}
    ids = np.repeat(np.array(settings["prompt"], dtype=np.int64), settings["batch"], axis=0)
    return adapter.run_generate(
        model,
        ids,
        settings["new_tokens"],
        settings["temperature"],
        settings["use_cache"],
        settings["seed"],
    )


def load(module: ModuleType, spec: dict[str, Any]) -> Any:
    """A trusted module's model with the seeded weights of ``spec``."""
    return adapter.build_model(module, spec["config"], make_state_dict(spec))
