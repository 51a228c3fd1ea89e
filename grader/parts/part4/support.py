"""Part 4's judgements on raw data, in trusted code: the int8 cache the student's
functions produced (its format, memory, reconstruction error and the tokens it
led to) and the figures ``measure_latency`` returned against the grader's clock.

Nothing here trusts a figure measured in the worker: bytes are counted from the
arrays the worker sent back, errors computed against the reference cache stored
with the cases, and every pass condition is written so that NaN fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grader.timing import Criterion, Ratio, Timing

# Bytes per element of the dtypes a quantised cache may hold (by torch's name).
ITEMSIZE = {"int8": 1, "uint8": 1, "bool": 1, "float16": 2, "bfloat16": 2, "int16": 2}
MAX_RATIO = 0.55  # int8 data and scales against the fp16 cache
MAX_ERROR = 0.02  # max|x - x_hat| / max|x| of every key and value tensor
MIN_AGREEMENT = 0.9  # greedy tokens equal to the full-precision cache's
EXACT_SHARE = 0.95  # int8 values equal to round(x / scale); the rest within 1 (ties, scales
# computed in float32 before they are stored in float16)
SCALE_RTOL = 2e-3  # float16 scales: one rounding step of 2^-10, and then some


def expected_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The handout's format for one (B, H, T, head_dim) tensor: one float16 scale per
    (batch, head, token) vector, max|x| / 127 (1 where 0), and q = round(x / scale)
    clamped to [-127, 127]."""
    absmax = np.abs(x.astype(np.float32)).max(axis=-1, keepdims=True)
    scale = np.minimum(absmax / np.float32(127), 65504).astype(np.float16)
    scale = np.where(scale == 0, np.float16(1), scale)
    q = np.clip(np.round(x.astype(np.float32) / scale.astype(np.float32)), -127, 127)
    return q.astype(np.int8), scale


def same_int8(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal but for a few values one step away (x / scale computed another way can land
    on the other side of a .5)."""
    if got.shape != want.shape:
        return False
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    return bool(diff.max(initial=0) <= 1 and (diff == 0).mean() >= EXACT_SHARE)


def int8_mistake(x: np.ndarray, candidates: list[np.ndarray]) -> str | None:
    """Which known deviation from the format an int8 tensor of the student's shows:
    ``"int8_truncates"`` (x / scale truncated, not rounded) or ``"int8_per_tensor_scale"``
    (one scale for the whole tensor); None if neither."""
    x32 = x.astype(np.float32)
    _, scale = expected_int8(x)
    truncated = np.clip(np.trunc(x32 / scale.astype(np.float32)), -127, 127).astype(np.int8)
    whole = np.float16(max(float(np.abs(x32).max()) / 127, 1e-8))
    per_tensor = np.clip(np.round(x32 / np.float32(whole)), -127, 127).astype(np.int8)
    for name, want in (("int8_truncates", truncated), ("int8_per_tensor_scale", per_tensor)):
        if any(same_int8(c, want) for c in candidates):
            return name
    return None


@dataclass
class Int8Verdict:
    """What the parent measured of a quantised cache, and what is wrong with it."""

    q_bytes: int = 0
    data_bytes: int = 0  # the int8 tensors alone
    fp16_bytes: int = 0
    max_error: float = math.nan
    agreement: float = math.nan
    problems: list[str] = field(default_factory=list)
    mistakes: list[str] = field(default_factory=list)  # catalogue names that explain them

    @property
    def ratio(self) -> float:
        return self.q_bytes / self.fp16_bytes if self.fp16_bytes else math.nan

    def failures(self, n_tokens: int) -> list[str]:
        """Every problem, the thresholds' included (each condition fails for NaN)."""
        problems = list(self.problems)
        if not self.ratio <= MAX_RATIO:
            problems.append(
                f"It uses {self.ratio:.2f} x the fp16 cache's memory (at most {MAX_RATIO})."
            )
        if not self.max_error <= MAX_ERROR:
            problems.append(
                f"Its max relative reconstruction error is {self.max_error:.2%} "
                f"(at most {MAX_ERROR:.0%})."
            )
        if not self.agreement >= MIN_AGREEMENT:
            problems.append(
                f"Greedy tokens agree on {self.agreement:.0%} of {n_tokens} "
                f"(at least {MIN_AGREEMENT:.0%})."
            )
        return problems

    @property
    def passed(self) -> bool:
        return not self.failures(0)


def judge_int8(
    originals: list[np.ndarray],
    q_arrays: list[np.ndarray],
    q_dtypes: list[str],
    reported_bytes: int | None,
    restored: list[np.ndarray] | None,
    tokens: np.ndarray | None,
    expected_tokens: np.ndarray,
) -> Int8Verdict:
    """Judge the student's int8 cache. ``originals``: the fp32 keys and values (k0, v0,
    k1, ...) the grader's cache held; ``q_arrays``/``q_dtypes``: every tensor
    ``quantize_kv_int8`` returned, with torch's dtype names; ``reported_bytes``: what
    ``quantized_kv_bytes`` said; ``restored``: the dequantised keys and values in the
    same order; ``tokens``: the greedy tokens generated from the dequantised cache."""
    v = Int8Verdict(fp16_bytes=sum(x.size * 2 for x in originals))
    sizes = [a.size * ITEMSIZE.get(d, a.itemsize) for a, d in zip(q_arrays, q_dtypes, strict=True)]
    v.q_bytes = sum(sizes)
    ints = [a for a, d in zip(q_arrays, q_dtypes, strict=True) if d == "int8"]
    v.data_bytes = sum(a.size for a in ints)
    floats = [a.astype(np.float32) for a, d in zip(q_arrays, q_dtypes, strict=True) if "float" in d]
    if not ints:
        if "uint8" in q_dtypes:
            v.problems.append(
                "The cache is a bare uint8 cast: negative keys and values wrap around and "
                "there is no scale."
            )
            v.mistakes.append("uint8_cast")
        else:
            v.problems.append(
                f"quantize_kv_int8 returned no torch.int8 tensor (dtypes: {sorted(set(q_dtypes))})."
            )
    else:
        for i, x in enumerate(originals):
            what = f"layer {i // 2}'s {'keys' if i % 2 == 0 else 'values'}"
            q_want, s_want = expected_int8(x)
            if not any(same_int8(a, q_want) for a in ints):
                mistake = int8_mistake(x, ints)
                v.problems.append(
                    f"The int8 tensor of {what} {x.shape} is not round(x / scale) clamped to "
                    "[-127, 127] with scale = max|x| / 127 for every (batch, head, token) "
                    "vector, as the handout asks."
                )
                if mistake:
                    v.mistakes.append(mistake)
                break
            if not any(
                a.size == s_want.size
                and np.allclose(a.reshape(-1), s_want.astype(np.float32).reshape(-1),
                                rtol=SCALE_RTOL, atol=0)
                for a in floats
            ):  # fmt: skip
                v.problems.append(
                    f"No stored scales match {what}: one max|x| / 127 per (batch, head, "
                    f"token), {s_want.size} of them."
                )
                break
    if not (isinstance(reported_bytes, int) and reported_bytes == v.q_bytes):
        line = (
            f"quantized_kv_bytes returned {reported_bytes!r}, but the tensors of the quantised "
            f"cache hold {v.q_bytes:,} bytes"
        )
        if v.data_bytes and reported_bytes == v.data_bytes:
            line += f" ({v.data_bytes:,} of int8 data and {v.q_bytes - v.data_bytes:,} of scales)"
            v.mistakes.append("int8_bytes_without_scales")
        v.problems.append(line + ".")
    v.max_error = reconstruction_error(originals, restored)
    if not math.isfinite(v.max_error):
        v.problems.append(
            f"dequantize_kv_int8 did not give back {len(originals) // 2} layers of finite keys "
            "and values of the original shapes."
        )
    if isinstance(tokens, np.ndarray) and tokens.shape == expected_tokens.shape:
        v.agreement = float((tokens == expected_tokens).mean())
    else:
        v.problems.append(
            f"Generation from the dequantised cache gave no {expected_tokens.shape} tokens."
        )
    return v


def reconstruction_error(originals: list[np.ndarray], restored: list[np.ndarray] | None) -> float:
    """max over tensors of max|x - x_hat| / max|x|; NaN if anything is missing or not finite."""
    if restored is None or len(restored) != len(originals):
        return math.nan
    errors = []
    for x, y in zip(originals, restored, strict=True):
        if y.shape != x.shape or not np.isfinite(y).all():
            return math.nan
        errors.append(float(np.abs(x - y).max() / max(float(np.abs(x).max()), 1e-12)))
    return max(errors)


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


def int8_reply(
    header: dict[str, Any], arrays: dict[str, np.ndarray], originals: list[np.ndarray]
) -> tuple[list[np.ndarray], list[str], int | None, list[np.ndarray] | None, np.ndarray | None]:
    """The raw data of the worker's int8 reply, validated: the quantised cache's tensors
    and their dtypes, what quantized_kv_bytes returned (an int or None), the dequantised
    keys and values in the originals' order, and the generated tokens."""
    dtypes = header.get("q_dtypes")
    if not (isinstance(dtypes, list) and all(isinstance(d, str) for d in dtypes)):
        dtypes = []
    q_arrays = [arrays.get(f"q{i}") for i in range(len(dtypes))]
    if not all(isinstance(a, np.ndarray) for a in q_arrays):
        q_arrays, dtypes = [], []
    enc = header.get("reported_bytes")
    reported = None
    if isinstance(enc, dict) and enc.get("kind") == "int" and isinstance(enc.get("value"), int):
        reported = enc["value"]
    layers = len(originals) // 2
    restored = None
    if header.get("deq_layers") == layers:
        restored = [arrays.get(f"deq_{kv}{i}") for i in range(layers) for kv in "kv"]
        if not all(isinstance(a, np.ndarray) for a in restored):
            restored = None
    tokens = arrays.get("tokens")
    return q_arrays, dtypes, reported, restored, tokens if isinstance(tokens, np.ndarray) else None


def generation_problem(
    case: dict[str, Any],
    cached: bool,
    prefix: int,
    lengths: list[Any],
    cause: Callable[[list[str]], str],
) -> str:
    """What a generation that gave other tokens did, from the calls it made (``cause``
    names catalogued mistakes)."""
    if prefix:
        total = len(case["ids"][0])
        problem = f"{case['label']}: generate_with_cache_from gave other tokens."
        if lengths and lengths[0] != total - prefix:
            problem += (
                f" Its first call fed {lengths[0]} tokens, but the cache already held "
                f"{prefix} of the {total}: feed only the {total - prefix} it does not hold."
            )
            if lengths[0] == total:
                problem += f" {cause(['cache_from_refeeds_prompt'])}"
        return problem
    mode = "with" if cached else "without"
    problem = f"{case['label']}: greedy generation {mode} the cache gave other tokens."
    if cached and any(x != 1 for x in lengths[1:]):
        problem += (
            f" forward received {lengths} tokens per call: after the prompt, each "
            "cached step must feed only the newest token."
        )
    return problem


# ------------------------------------------------------------------ measure_latency

LATENCY_KEYS = ("no_cache_ms_per_token", "cache_ms_per_token")
MAX_SHARE = 1.1  # timed runs (from the figures) may fill at most this share of the work time
MIN_SHARE = 0.02  # ... and at least this share of it (ms, not seconds): stalls may fill the rest


def latency_figures(result: Any, L_values: list[int]) -> tuple[dict[str, list[float]], str]:
    """The figures of a decoded ``measure_latency`` result, or "" and a problem."""
    if not isinstance(result, dict):
        return {}, "measure_latency must return a dict."
    got: dict[str, list[float]] = {}
    if result.get("L") != L_values:
        return {}, f"measure_latency returned L = {result.get('L')!r} for L_values = {L_values}."
    for key in LATENCY_KEYS:
        values = result.get(key)
        if not (
            isinstance(values, list)
            and len(values) == len(L_values)
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in values)
            and all(math.isfinite(x) and x > 0 for x in values)
        ):
            return {}, (
                f"measure_latency's {key!r} must be {len(L_values)} finite positive "
                f"numbers, got {values!r}."
            )
        got[key] = [float(x) for x in values]
    return got, ""


@dataclass(frozen=True)
class LatencyVerdict:
    """The timed runs the figures stand for, against the grader's clock."""

    timed_s: float  # sum over L and modes of ms/token x L x repeats, in seconds
    work_s: float  # the call's wall time less the grader's one-off delay
    delay_s: float
    longest_run_s: float  # the slowest single run the figures stand for

    @property
    def share(self) -> float:
        return self.timed_s / self.work_s if self.work_s > 0 else math.inf

    @property
    def passed(self) -> bool:
        return MIN_SHARE <= self.share <= MAX_SHARE

    def summary(self, what: str, figures: dict[str, list[float]]) -> str:
        return (
            f"{what} returned {rounded(figures)}; the timed runs they stand for add up to "
            f"{self.timed_s:.3f} s; the call spent {self.work_s:.3f} s generating."
        )

    def explain(self, what: str, figures: dict[str, list[float]]) -> str:
        """Why the figures do not fit the grader's clock, and what they should be."""
        return (
            f"{what} returned {rounded(figures)}. As ms per token x L for every timed run they "
            f"stand for {self.timed_s:.3f} s of timed generation, but by the grader's clock "
            f"the call spent {self.work_s:.3f} s generating (its whole time less a one-off delay "
            f"of {self.delay_s:.2f} s that the grader put in the very first model call, which "
            "a warm-up run absorbs). The timed runs must fit in that time and fill a fair part "
            "of it: report the median of the timed runs, after the warm-up runs, divided by L, "
            "in milliseconds."
        )

    def mistake(self, totals_share: float) -> str | None:
        """``"latency_no_warmup"`` when one run holds at least half the delay and the others
        fit in the work time; ``"latency_totals"`` when the figures fit as whole-run times;
        None otherwise."""
        if self.passed:
            return None
        rest = self.timed_s - self.longest_run_s
        if self.longest_run_s >= self.delay_s / 2 and rest <= MAX_SHARE * self.work_s:
            return "latency_no_warmup"
        if MIN_SHARE <= totals_share <= MAX_SHARE:
            return "latency_totals"
        return None


def rounded(figures: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [float(f"{x:.4g}") for x in v] for k, v in figures.items()}


def judge_latency(
    figures: dict[str, list[float]],
    L_values: list[int],
    repeats: int,
    wall_s: float,
    delay_s: float,
) -> tuple[LatencyVerdict, float]:
    """The verdict, and the share the figures would fill were they whole-run times."""
    runs = [
        ms * L / 1000 for key in LATENCY_KEYS for ms, L in zip(figures[key], L_values, strict=True)
    ]
    totals = [ms / 1000 for key in LATENCY_KEYS for ms in figures[key]]
    work = wall_s - delay_s
    verdict = LatencyVerdict(sum(runs) * repeats, work, delay_s, max(runs))
    totals_share = sum(totals) * repeats / work if work > 0 else math.inf
    return verdict, totals_share


# ------------------------------------------------------------------------- 4.6


def latency_criteria(
    timings: dict[str, Timing], bench: dict[str, Any], clock: str
) -> list[Criterion]:
    """4.6's verdicts on per-token timings of the variants ``"with/without the cache, L =
    N"``: cached nearly flat, cache-free growing, and the cache faster at the longest L
    (a cache that does not cache can look flat enough on a tiny model; it is never faster)."""
    lo, hi = bench["L_values"]
    on = "CPU time" if clock == "cpu" else "time"

    def mode(cached: bool, L: int) -> list[float]:
        return timings[f"{'with' if cached else 'without'} the cache, L = {L}"].on(clock)

    return [
        Criterion(
            "part4.max_cached_growth",
            f"cached {on} per token, L = {hi} over L = {lo}",
            Ratio.between(mode(True, hi), mode(True, lo)),
            bench["max_cached_growth"],
            False,
        ),
        Criterion(
            "part4.min_no_cache_growth",
            f"cache-free {on} per token, L = {hi} over L = {lo}",
            Ratio.between(mode(False, hi), mode(False, lo)),
            bench["min_no_cache_growth"],
            True,
        ),
        Criterion(
            "part4.min_speedup",
            f"cache-free over cached {on} per token, L = {hi}",
            Ratio.between(mode(False, hi), mode(True, hi)),
            bench["min_speedup"],
            True,
        ),
    ]
