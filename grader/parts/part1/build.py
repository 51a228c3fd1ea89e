"""Part 1 test-case generation from the reference calculator (and its mutants).

Public cases use the handout's specs; hidden cases are seeded random specs
and shapes. Each case stores the reference's value and, for every mutant
whose value differs, that value: the diagnosis catalogue.

Besides the single mistakes, a case stores the values of their combinations
(:mod:`grader.parts.part1.combine`), and the answer table's case says which call each
of its entries comes from (``entries_from``), so a wrong entry that follows from a
wrong function can point back to its check.

Every public case is a write-up answer, and the public file ships in
``student.zip``: its cases hold their expected value and mistakes sealed
(:mod:`grader.parts.part1.seal`), and the hidden file holds them in plain form
(``answers``, by case id) for the autograder.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

from grader.judging.base import same_value
from grader.parts.part1.combine import Combiner, combined_mistakes
from grader.parts.part1.seal import MISTAKE, seal

GIB = 2**30
REL_TOL = 1e-6
SEED = 20240501

LLAMA3_8B = dict(
    n_layers=32, n_q_heads=32, n_kv_heads=8, d_model=4096, d_ff=14336, vocab_size=128256
)
LLAMA32_1B = dict(
    n_layers=16, n_q_heads=32, n_kv_heads=8, d_model=2048, d_ff=8192, vocab_size=128256
)


def spec(fields: dict[str, Any]) -> dict[str, Any]:
    """A model spec as it crosses to the worker."""
    return {"__spec__": dict(fields)}


def _decode(module: ModuleType, value: Any) -> Any:
    if isinstance(value, dict) and "__spec__" in value:
        return module.ModelSpec(**value["__spec__"])
    return value


def call(module: ModuleType, case: dict[str, Any]) -> Any:
    """Run ``case`` against a trusted module (the reference or a mutant)."""
    fn: Callable = getattr(module, case["func"])
    args = [_decode(module, a) for a in case["args"]]
    kwargs = {k: _decode(module, v) for k, v in case["kwargs"].items()}
    return fn(*args, **kwargs)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return int(value) if isinstance(value, int) else float(value)


def finish(
    case: dict[str, Any],
    reference: ModuleType,
    mutants: dict[str, ModuleType],
    combiner: Combiner | None = None,
) -> dict[str, Any]:
    """Fill in the expected value and the mutants' differing values, then (with a
    ``combiner``) the values of the combinations of those mutants that no smaller set
    gives."""
    expected = _plain(call(reference, case))
    mistakes = {}
    for name, module in mutants.items():
        try:
            value = _plain(call(module, case))
        except Exception:
            continue
        if not same_value(value, expected, REL_TOL):
            mistakes[name] = value
    if combiner is not None:
        mistakes |= combined_mistakes(
            mistakes, expected, lambda m: _plain(call(m, case)), combiner, REL_TOL
        )
    want = "table" if isinstance(expected, dict) else type(expected).__name__
    return {**case, "want": want, "expected": expected, "mistakes": mistakes}


def case(num: str, label: str, func: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """One call of ``func`` for check ``num``, with the label its feedback shows."""
    return {"check": num, "label": label, "func": func, "args": list(args), "kwargs": kwargs}


def public_cases() -> list[dict[str, Any]]:
    """The handout's numbers: LLaMA-3-8B and Llama-3.2-1B, N = 1024, d = 128."""
    big, small = spec(LLAMA3_8B), spec(LLAMA32_1B)
    gpu = 80 * GIB
    out = [
        case("1.1", "LLaMA-3-8B", "param_count", big),
        case("1.1", "Llama-3.2-1B", "param_count", small),
        case("1.2", "LLaMA-3-8B", "weight_bytes", big),
        case("1.2", "Llama-3.2-1B", "weight_bytes", small),
        case("1.3", "LLaMA-3-8B, context 1024, fp16", "kv_cache_bytes_per_request", big, 1024),
        case("1.3", "LLaMA-3-8B, context 8192, fp32", "kv_cache_bytes_per_request", big, 8192, 4),
        case("1.4", "LLaMA-3-8B, 80 GiB, context 1024", "max_batch_size", big, gpu, 1024),
        case("1.4", "Llama-3.2-1B, 80 GiB, context 4096", "max_batch_size", small, gpu, 4096),
        # The handout's "0 if the weights do not fit" (15 GiB of weights on 8 GiB).
        case("1.4", "LLaMA-3-8B, 8 GiB, context 1024", "max_batch_size", big, 8 * GIB, 1024),
    ]
    for tp in (2, 4, 8):
        out.append(case("1.5", f"LLaMA-3-8B, TP = {tp}", "max_batch_size", big, gpu, 1024, tp=tp))
    for phase in ("prefill", "decode"):
        out.append(case("1.6", f"N=1024, d=128, {phase}", "attention_flops", 1024, 128, phase))
        out.append(case("1.7", f"N=1024, d=128, {phase}", "attention_bytes", 1024, 128, phase))
        out.append(case("1.8", f"N=1024, d=128, {phase}", "arithmetic_intensity", 1024, 128, phase))
    for batch in (1, 8, 64):
        out.append(
            case(
                "1.9",
                f"N=1024, d=128, decode, batch {batch}",
                "arithmetic_intensity",
                1024,
                128,
                "decode",
                batch=batch,
            )
        )
    out.append({**case("1.10", "defaults", "answer_table"), "entries_from": table_sources()})
    return out


def table_sources() -> dict[str, dict[str, Any]]:
    """Each entry of the default answer table as ``scale`` times one call of the
    calculator (checked against the reference by :func:`check_table_sources`)."""
    big, gpu = spec(LLAMA3_8B), 80 * GIB

    def source(func: str, *args: Any, scale: float = 1, **kwargs: Any) -> dict[str, Any]:
        return {"func": func, "args": list(args), "kwargs": kwargs, "scale": scale}

    return {
        "total_params": source("param_count", big),
        "total_params_billion": source("param_count", big, scale=1e-9),
        "weight_gib": source("weight_bytes", big, scale=1 / GIB),
        "kv_cache_per_request_gib": source(
            "kv_cache_bytes_per_request", big, 1024, 2, scale=1 / GIB
        ),
        "max_batch_size": source("max_batch_size", big, gpu, 1024),
        "max_batch_size_tp": source("max_batch_size", big, gpu, 1024, tp=2),
        "ai_prefill": source("arithmetic_intensity", 1024, 128, "prefill"),
        "ai_decode": source("arithmetic_intensity", 1024, 128, "decode"),
    }


def check_table_sources(reference: ModuleType, table: dict[str, Any]) -> None:
    """Refuse ``entries_from`` unless every entry of the reference's table is its call's
    value times its scale (the table's defaults changed in the solution, say)."""
    sources = table_sources()
    if sources.keys() != table.keys():
        raise ValueError("table_sources() and the reference's answer_table differ in keys")
    for key, src in sources.items():
        derived = src["scale"] * call(reference, src)
        if not same_value(float(table[key]), float(derived), REL_TOL):
            raise ValueError(f"answer_table[{key!r}] is not what table_sources() says")


def random_spec(rng: random.Random) -> dict[str, Any]:
    head_dim = rng.choice([64, 128])
    n_q = rng.choice([8, 16, 32, 48, 64])
    n_kv = rng.choice([d for d in (1, 2, 4, 8, 16, n_q) if n_q % d == 0])
    d_model = n_q * head_dim
    return dict(
        n_layers=rng.randint(2, 80),
        n_q_heads=n_q,
        n_kv_heads=n_kv,
        d_model=d_model,
        d_ff=256 * rng.randint(d_model // 256, 4 * d_model // 256),
        vocab_size=rng.randint(1000, 256000),
        bytes_per_param=rng.choice([1, 2, 4]),
        tied_embeddings=rng.random() < 0.3,
    )


def hidden_cases(seed: int = SEED, n_specs: int = 8, n_shapes: int = 8) -> list[dict[str, Any]]:
    """Seeded random specs (check 1.12) and attention shapes (check 1.13)."""
    rng = random.Random(seed)
    out = []
    for i in range(n_specs):
        s = spec(random_spec(rng))
        ctx = rng.choice([512, 2048, 4096, 8192, 32768])
        gpu = rng.choice([24, 40, 48, 80, 141]) * GIB
        tp = rng.choice([1, 2, 4, 8])
        label = f"hidden spec #{i + 1}"
        out += [
            case("1.12", label, "param_count", s),
            case("1.12", label, "weight_bytes", s),
            case("1.12", label, "kv_cache_bytes_per_request", s, ctx, rng.choice([1, 2, 4])),
            case("1.12", label, "max_batch_size", s, gpu, ctx, tp=tp),
        ]
    for i in range(n_shapes):
        n, d = rng.choice([128, 333, 2048, 4096, 16384]), rng.choice([64, 96, 128])
        bpe = rng.choice([1, 2, 4])
        label = f"hidden shape #{i + 1}"
        for phase in ("prefill", "decode"):
            out += [
                case("1.13", label, "attention_flops", n, d, phase),
                case("1.13", label, "attention_bytes", n, d, phase, bpe),
                case(
                    "1.13",
                    label,
                    "arithmetic_intensity",
                    n,
                    d,
                    phase,
                    bpe,
                    batch=rng.randint(1, 128),
                ),
            ]
    return out


#: The write-up's integer answers (1.1 to 1.7) can be searched for against their seals (a
#: batch size by trying 0, 1, 2, ...), so each of these checks also asks for one input of
#: its own: a public one whose answer the self-check may show, and on Gradescope a hidden
#: one. An answer written in for the write-up's inputs earns nothing.
COMPANION_SEED = 20251125


def companion_cases(rng: random.Random, label: str) -> list[dict[str, Any]]:
    """One random input for each of checks 1.1 to 1.7, labelled ``label``."""
    s = spec(random_spec(rng))
    n, d = rng.choice([256, 333, 2048, 4096]), rng.choice([64, 96, 128])
    phase = rng.choice(["prefill", "decode"])
    gpu = rng.choice([24, 40, 48, 141]) * GIB
    return [
        case("1.1", label, "param_count", s),
        case("1.2", label, "weight_bytes", s),
        case("1.3", label, "kv_cache_bytes_per_request", s, rng.choice([512, 2048]), 2),
        case("1.4", label, "max_batch_size", s, gpu, rng.choice([512, 2048])),
        case("1.5", label, "max_batch_size", s, gpu, 1024, tp=rng.choice([2, 4, 8])),
        case("1.6", label, "attention_flops", n, d, phase),
        case("1.7", label, "attention_bytes", n, d, phase),
    ]


def case_id(case: dict[str, Any]) -> str:
    """A public case's id: its check and label (unique within the file)."""
    return f"{case['check']} {case['label']}"


def sealed(case: dict[str, Any]) -> dict[str, Any]:
    """A finished case with its expected value and mistakes sealed, for the public file."""
    cid = case_id(case)
    seals = {
        "expected": seal(case["expected"], cid, "expected", REL_TOL),
        "mistakes": {name: seal(v, cid, MISTAKE, REL_TOL) for name, v in case["mistakes"].items()},
    }
    plain = {k: v for k, v in case.items() if k not in ("expected", "mistakes")}
    return {**plain, "id": cid, "sealed": seals}


def build(
    reference: ModuleType,
    mutants: dict[str, ModuleType],
    diagnoses: dict[str, str],
    combiner: Combiner | None = None,
) -> dict[str, dict[str, Any]]:
    """``{"public": ..., "hidden": ...}`` case files for Part 1.

    The public cases (all write-up answers) are sealed; the hidden file carries their
    plain values in ``answers`` besides its own random cases. With a ``combiner``, every
    case also stores its combined mistakes.
    """

    def document(cases: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "part": "part1",
            "version": 2,
            "rel_tol": REL_TOL,
            "diagnoses": diagnoses,
            "cases": cases,
            **extra,
        }

    def done(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [finish(c, reference, mutants, combiner) for c in cases]

    public = done(public_cases())
    for c in public:
        if "entries_from" in c:
            check_table_sources(reference, c["expected"])
    ids = [case_id(c) for c in public]
    if len(set(ids)) != len(ids):
        raise ValueError("two public Part 1 cases share a check and a label")
    answers = {case_id(c): {"expected": c["expected"], "mistakes": c["mistakes"]} for c in public}
    rng = random.Random(COMPANION_SEED)
    own = [{**c, "own_input": True} for c in done(companion_cases(rng, "an input of its own"))]
    hidden = done(hidden_cases()) + done(companion_cases(rng, "hidden input"))
    return {
        "public": document([*(sealed(c) for c in public), *own]),
        "hidden": document(hidden, answers=answers),
    }
