"""Part 2 test data: seeded weights, the course-format public cases, hidden cases
and the diagnosis catalogue, all produced by running the reference (and every
mutant) through the same adapter functions that later observe the student.

Weights are not stored for grading: both models' weights are drawn from a
seeded NumPy generator (:func:`make_state_dict`) and checked against a stored
digest, so the grader needs no solution code and no weight files at run time. A
GPU workload's benchmark model is drawn by each worker on the grading device
(``adapter_weights.draw_on``), from the same scales.
Students get the public model as ``model_state_dict.pt``.

Every model has the course's architecture, fixed by the course's own weight
file: attention projections without biases (``W_o`` included), learned
positions, biases in the feed-forward block, the norms and the output
projection. The public model is the course's size (``max_seq_len`` 128); the
hidden one has other sizes and weights; the benchmark's model only has more
positions, for its 1000-token prompt.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from grader.core.thresholds import probe_thresholds, timed_rounds
from grader.parts.part2.adapter_weights import state_dict_shapes, weight_scale

ATOL = 1e-2  # absolute tolerance on every logit, the handout's and the harness's

PUBLIC_MODEL = {
    "config": {
        "vocab_size": 1000,
        "d_model": 50,
        "d_ff": 100,
        "num_layers": 2,
        "max_seq_len": 128,
    },
    "seed": 20240211,
}
BENCH_SEED = 424242  # the benchmark's model (check 2.11), see bench_model()
HIDDEN_MODEL = {
    "config": {"vocab_size": 640, "d_model": 64, "d_ff": 160, "num_layers": 3, "max_seq_len": 320},
    "seed": 77031,
}
# A hidden model of one layer: the cache of "every layer" is then a single pair.
ONE_LAYER_MODEL = {
    "config": {"vocab_size": 300, "d_model": 32, "d_ff": 64, "num_layers": 1, "max_seq_len": 64},
    "seed": 41041,
}
PUBLIC_SEED = 5150
HIDDEN_SEED = 90210
POOL_SEED = 60606  # the timed runs' prompts (hidden), see build.bench_pool()
# Timed runs sample at this temperature: the model's top token, whatever the sampler,
# since every expected step wins by at least POOL_MIN_GAP (a factor e^-100 for the next).
CACHE_PROBE_PREFILL = 6  # check 2.11's look at the cache: 6 prompt tokens, then 2 steps
POOL_TEMPERATURE = 1e-5
POOL_MIN_GAP = 1e-3
# Check 2.9's work probe: rounds of one cached and one cache-free generate of WORK_NEW
# tokens after WORK_PROMPT-token prompts (WORK_BATCH rows), on the CPU, in CPU time.
# Many new tokens after short prompts: the cache-free work grows with every step, the
# cached work does not, however the prompt is fed (at once or token by token). The
# reference measured 9.3x here on one thread with 192 new tokens, 8.6-9.1x with 96 (a third
# of the CPU time: the cache-free work grows with the square of the tokens).
WORK_ROUNDS, WORK_BATCH, WORK_PROMPT, WORK_NEW = 2, 8, 64, 96
# The work model's positions: room for the growth probe's longest run (below).
WORK_POSITIONS = 256
# Check 2.9's growth probe: the cached path alone, one round (if it decides) or
# GROWTH_ROUNDS rounds in all, each of one cached generate of GROWTH_SHORT and one of
# GROWTH_LONG new tokens after GROWTH_PROMPT-token prompts (GROWTH_BATCH rows, fresh ones
# every run), on the work model's CPU, in CPU time.
# Its CPU time per generated token, long over short, must stay within MAX_CACHED_GROWTH:
# with a cache every step costs about the same, while recomputing the prefix makes the
# steps of the long run dearer, however slow the submission makes its own cache-free
# path (which the work ratio above, and check 2.11, compare against).
GROWTH_ROUNDS, GROWTH_BATCH, GROWTH_PROMPT, GROWTH_SHORT = 3, 8, 8, 16
GROWTH_LONG = WORK_POSITIONS - GROWTH_PROMPT  # 248: up to the work model's positions
# The probes' limits (cache-free over cached CPU time in the work probe, the growth
# probe's long run over its short one per new token) are thresholds.toml's [probes.part2].
MIN_WORK_RATIO = probe_thresholds("part2")["min_work_ratio"]
MAX_CACHED_GROWTH = probe_thresholds("part2")["max_cached_growth"]
# Check 2.10's sampling probe: the first new token after one prompt, drawn SAMPLE_ROWS x
# SAMPLE_CALLS times (seeds 0, 1, ...) with generate's temperature left at its default, 1.0.
# The likeliest token's frequency must lie within SAMPLE_SIGMAS standard deviations of its
# probability under softmax(logits / 1.0) of the submission's own forward.
SAMPLE_ROWS, SAMPLE_CALLS, SAMPLE_SIGMAS = 1024, 8, 6.0
SAMPLE_SEED = 8080  # the prompts tried when the probe is built


def frequency_band(p: float, draws: int, sigmas: float = SAMPLE_SIGMAS) -> float:
    """Half-width of the accepted band for the frequency of an outcome of probability
    ``p`` in ``draws`` independent draws (NaN for a NaN ``p``)."""
    return sigmas * float(np.sqrt(p * (1 - p) / draws))


def softmax64(logits: np.ndarray) -> np.ndarray:
    """softmax over the last axis in float64 (NaN logits give NaN probabilities)."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


SIZE_KEYS = ("d_model", "d_ff", "num_layers")  # what a profile's benchmark model may set


def pool_key(prompt_len: int, new_tokens: int, sizes: dict[str, int] | None = None) -> str:
    """The key of the timed runs' prompt pool for a benchmark of these lengths (and, for
    a profile with a benchmark model of its own, of that model's sizes)."""
    key = f"{prompt_len}x{new_tokens}"
    return key + "@" + "x".join(str(sizes[k]) for k in SIZE_KEYS) if sizes else key


def pool_size(bench: dict[str, Any]) -> int:
    """Prompts one grading consumes at most: every round of check 2.11 (warm-up and
    confirmation included) runs both variants, each on a prompt of its own."""
    return 2 * timed_rounds(bench)


# ----------------------------------------------------------------------- weights


def bench_model(
    public: dict[str, Any], positions: int, sizes: dict[str, int] | None = None
) -> dict[str, Any]:
    """The benchmark's model: the public sizes (or ``sizes``, a profile's own) with
    ``positions`` positions.

    The course's 128 positions cannot hold the benchmark's 1000-token prompt, and on a
    GPU the public width leaves a step bound by kernel launches. Timing does not depend
    on the weights, so this model is derived when the benchmark runs (its sizes come
    from the thresholds file) and its seeded weights carry no stored digest.
    """
    config = {**public["config"], **(sizes or {}), "max_seq_len": positions}
    if sizes:  # a GPU workload's: drawn by the worker, on the grading device
        return {"config": config, "seed": BENCH_SEED, "on_device": True}
    return {"config": config, "seed": BENCH_SEED}


def load_header(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The worker request that loads model ``name`` of ``spec``. The grader sends the
    seeded weights with it, except where the worker draws them on the grading device
    (``on_device``: their seed travels instead)."""
    header = {"op": "load", "model": name, "config": spec["config"]}
    if spec.get("on_device"):
        header.update(seed=spec["seed"], on_device=True)
    return header


def _draw(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    mean, std = weight_scale(name, shape)
    return mean + std * rng.standard_normal(shape)


def make_state_dict(model: dict[str, Any]) -> dict[str, np.ndarray]:
    """The float32 weights of ``model`` ({"config", "seed"}), deterministic in the seed."""
    rng = np.random.default_rng(model["seed"])
    return {
        name: _draw(rng, name, shape).astype(np.float32)
        for name, shape in state_dict_shapes(model["config"]).items()
    }


#: Copies of a model with one path switched off, for naming mistakes in the cached modes:
#: two mistakes at once (positions and mask not offset) blend in the logits, but each
#: shows alone where the other's path is off (checks 2.4 and 2.5, see ``ablate``).
ABLATIONS = ("no_positions", "no_attention")
CACHED_MODES = ("sequential", "chunks")


def ablate(weights: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """``weights`` with one path of the model switched off: the position embeddings
    (``no_positions``: where a token sits changes nothing, so no position mistake shows)
    or every attention value projection (``no_attention``: attention adds nothing, so no
    mask or cache mistake shows)."""
    if kind not in ABLATIONS:
        raise ValueError(f"unknown ablation {kind!r}")
    off = "pos_embedding.weight" if kind == "no_positions" else "attention.W_v.weight"
    return {k: np.zeros_like(v) if k.endswith(off) else v for k, v in weights.items()}


def torch_state_dict_bytes(weights: dict[str, np.ndarray]) -> bytes:
    """``model_state_dict.pt`` as students load it with ``torch.load``."""
    import torch

    buf = io.BytesIO()
    torch.save({k: torch.from_numpy(v.copy()) for k, v in weights.items()}, buf)
    return buf.getvalue()


# ------------------------------------------------------------------------- plans


def chunk_plan(length: int, prefill: int | None = None, chunk: int = 3) -> list[int]:
    """Call lengths summing to ``length``: a prefill, then chunks of ``chunk`` tokens."""
    first = prefill if prefill is not None else (length + 1) // 2
    steps = [first]
    while sum(steps) < length:
        steps.append(min(chunk, length - sum(steps)))
    return steps


def probe_steps(mode: str, length: int) -> list[int] | None:
    """The forward plan of a mode: None is one call without the cache."""
    return {
        "no_cache": None,
        "full_cache": [length],
        "sequential": [1] * length,
        "chunks": chunk_plan(length),
    }[mode]


def top2_gap(logits: np.ndarray) -> float:
    """Smallest gap between the best and second-best logit over (B, T, V) logits."""
    part = np.sort(logits, axis=-1)[..., -2:]
    return float((part[..., 1] - part[..., 0]).min())


def clear_win(logits: np.ndarray, new_tokens: np.ndarray) -> bool:
    """Whether ``new_tokens`` (B, n) are the greedy choice of ``logits`` (B, n, vocab) at
    every step, each by at least ``POOL_MIN_GAP``: an answer that another correct
    implementation's rounding cannot change, fit for a timed run's pool."""
    wins = bool(np.array_equal(logits.argmax(-1), new_tokens))
    return wins and top2_gap(logits) >= POOL_MIN_GAP


def random_ids(rng: np.random.Generator, vocab: int, batch: int, length: int) -> np.ndarray:
    return rng.integers(0, vocab, size=(batch, length), dtype=np.int64)
