"""Part 4 data: the small GPT-2 models the lab is graded on, public and hidden prompts,
the reference's tokens and per-step logits (built by ``regen`` through the adapter), and
``theoretical_kv_bytes`` inputs. Checks 4.2-4.4 run every case they find: the public
ones in a student's self-check, public and hidden ones on Gradescope."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from grader.cases_part2 import encode_array
from grader.worker import adapter_part4 as adapter

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


def generation_cases(
    reference: ModuleType,
    rng: np.random.Generator,
    shapes: tuple[tuple[str, dict[str, Any], int, int], ...] = (
        ("lab", LAB_MODEL, 2, 8),
        ("hidden", HIDDEN_MODEL, 1, 12),
    ),
    prefix: str = "",
) -> list[dict[str, Any]]:
    """Random prompts with the reference's tokens and the logits of every cached step."""
    cases = []
    for name, spec, batch, length in shapes:
        model = adapter.build(spec["config"], spec["seed"])
        ids = rng.integers(0, spec["config"]["vocab_size"], size=(batch, length))
        out = adapter.run_generate(reference, model, ids, NEW_TOKENS, cached=True)
        cases.append(
            {
                "check": "4.2",
                "label": f"{prefix}{name} model, batch {batch}, {length}-token prompt",
                "model": name,
                "ids": ids.tolist(),
                "tokens": out["tokens"].tolist(),
                "step_logits": encode_array(out["step_logits"]),
            }
        )
    return cases


def theory_cases(
    reference: ModuleType, rng: np.random.Generator, n: int = 8
) -> list[dict[str, Any]]:
    """Random ``(L, D, n_layers, bytes)`` with the reference's byte count."""
    cases = []
    for _ in range(n):
        args = [
            int(rng.integers(1, 8193)),  # L
            int(rng.choice([64, 768, 2048, 4096])),  # D
            int(rng.integers(1, 49)),  # n_layers
            int(rng.choice([1, 2, 4])),  # bytes per element
        ]
        cases.append(
            {"check": "4.4", "args": args, "expected": int(reference.theoretical_kv_bytes(*args))}
        )
    return cases


def build(reference: ModuleType, mutants: dict[str, ModuleType], diagnoses: dict[str, str]) -> dict:
    """Part 4's files: relative path -> (schema name, document)."""
    rng = np.random.default_rng(SEED)
    hidden = {
        "part": "part4",
        "version": 1,
        "cases": generation_cases(reference, rng, prefix="hidden prompt, ")
        + theory_cases(reference, rng),
    }
    public = {
        "part": "part4",
        "version": 1,
        "atol": ATOL,
        "new_tokens": NEW_TOKENS,
        "models": {"lab": LAB_MODEL, "hidden": HIDDEN_MODEL},
        "diagnoses": diagnoses,
        "signatures": signatures(reference, mutants),
        "cases": public_cases(reference),
    }
    return {
        "public/part4.json": ("part4_cases", public),
        "hidden/part4.json": ("part4_cases", hidden),
    }


def public_cases(reference: ModuleType) -> list[dict[str, Any]]:
    """The self-check's counterparts of the hidden cases: other prompts on the same two
    models and other ``theoretical_kv_bytes`` inputs, judged with the same messages."""
    rng = np.random.default_rng(PUBLIC_SEED)
    shapes = (("lab", LAB_MODEL, 1, 6), ("hidden", HIDDEN_MODEL, 2, 5))
    return generation_cases(reference, rng, shapes, prefix="public prompt, ") + theory_cases(
        reference, rng, n=4
    )


def signatures(reference: ModuleType, mutants: dict[str, ModuleType]) -> dict[str, dict]:
    """What each mutant shows on the probes, where it differs from the reference."""
    model = adapter.build(LAB_MODEL["config"], LAB_MODEL["seed"])
    ids = np.arange(1, 9, dtype=np.int64)[None, :]

    def observe(mod: ModuleType) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        try:
            out = adapter.run_generate(mod, model, ids, 8, cached=True)
            seen["cached_lengths"] = out["lengths"]
            seen["cached_tokens"] = out["tokens"].tolist()
        except Exception as exc:
            seen["cached_lengths"] = seen["cached_tokens"] = f"{type(exc).__name__}: {exc}"[:500]
        try:
            seen["int8_dtypes"] = adapter.run_int8(mod, model, ids, 8)["dtypes"]
        except Exception as exc:
            seen["int8_dtypes"] = f"{type(exc).__name__}: {exc}"[:500]
        return seen

    expected = observe(reference)
    table: dict[str, dict] = {key: {} for key in expected}
    for name, mod in mutants.items():
        for key, value in observe(mod).items():
            if value != expected[key]:
                table[key][name] = value
    return table
