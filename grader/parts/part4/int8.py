"""Part 4's int8 cache (the bonus, check 4.7), judged in trusted code on the raw
data the worker sent back: the tensors ``quantize_kv_int8`` produced, what
``quantized_kv_bytes`` said, the keys and values ``dequantize_kv_int8`` gave back
and the tokens generated from them.

Nothing here trusts a figure measured in the worker: bytes are counted from the
arrays, errors computed against the cache the grader built (stored with the
cases), and every pass condition is written so that NaN fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grader.judging.base import shown

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
    max_ratio: float = MAX_RATIO  # inf where the memory is judged on another cache

    @property
    def ratio(self) -> float:
        return self.q_bytes / self.fp16_bytes if self.fp16_bytes else math.nan

    def failures(self, n_tokens: int) -> list[str]:
        """Every problem, the thresholds' included (each condition fails for NaN)."""
        problems = list(self.problems)
        if not self.ratio <= self.max_ratio:
            problems.append(
                f"It uses {self.ratio:.2f} x the fp16 cache's memory (at most {self.max_ratio})."
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
    count_bytes(v, q_arrays, q_dtypes)
    format_problems(v, originals, q_arrays, q_dtypes)
    bytes_problem(v, reported_bytes)
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


def judge_int8_cache(
    originals: list[np.ndarray],
    q_arrays: list[np.ndarray],
    q_dtypes: list[str],
    reported_bytes: int | None,
    restored: list[np.ndarray] | None,
    restored_dtypes: list[str],
) -> Int8Verdict:
    """Judge the round trip of a cache the grader made up, with no model to generate
    from: ``originals`` are its keys and values (k0, v0, ...) in their own dtype
    (float16), with all-zero vectors and a small head_dim, so that every vector's
    extreme (±127) is a quarter of the values. The format, the bytes, the dtype the
    keys and values come back in and the reconstruction error are judged; there are
    no tokens, so the agreement is not, and the memory is judged on the model's cache
    (with 4 values per vector, a scale costs half as much as its data)."""
    v = Int8Verdict(
        fp16_bytes=sum(x.size * 2 for x in originals), agreement=1.0, max_ratio=math.inf
    )
    count_bytes(v, q_arrays, q_dtypes)
    format_problems(v, originals, q_arrays, q_dtypes)
    bytes_problem(v, reported_bytes)
    dtype = str(originals[0].dtype) if originals else "float16"
    wrong = sorted({d for d in restored_dtypes if d != dtype})
    if wrong or len(restored_dtypes) != len(originals):
        v.problems.append(
            f"dequantize_kv_int8 gave back keys and values of dtype {', '.join(wrong) or '?'} "
            f"for a {dtype} cache: they must come back in the cache's original dtype."
        )
    as_float = None if restored is None else [y.astype(np.float32) for y in restored]
    v.max_error = reconstruction_error([x.astype(np.float32) for x in originals], as_float)
    if not math.isfinite(v.max_error):
        v.problems.append(
            f"dequantize_kv_int8 did not give back {len(originals) // 2} layers of finite keys "
            f"and values of the original shapes for a {dtype} cache with all-zero vectors."
        )
    return v


def count_bytes(v: Int8Verdict, q_arrays: list[np.ndarray], q_dtypes: list[str]) -> None:
    """The quantised cache's bytes, counted here from its tensors (data and all)."""
    sizes = [a.size * ITEMSIZE.get(d, a.itemsize) for a, d in zip(q_arrays, q_dtypes, strict=True)]
    v.q_bytes = sum(sizes)
    v.data_bytes = sum(a.size for a, d in zip(q_arrays, q_dtypes, strict=True) if d == "int8")


def bytes_problem(v: Int8Verdict, reported_bytes: int | None) -> None:
    """What ``quantized_kv_bytes`` said against the bytes counted here."""
    if isinstance(reported_bytes, int) and reported_bytes == v.q_bytes:
        return
    line = (
        f"quantized_kv_bytes returned {shown(reported_bytes)}, but the tensors of the quantised "
        f"cache hold {v.q_bytes:,} bytes"
    )
    if v.data_bytes and reported_bytes == v.data_bytes:
        line += f" ({v.data_bytes:,} of int8 data and {v.q_bytes - v.data_bytes:,} of scales)"
        v.mistakes.append("int8_bytes_without_scales")
    v.problems.append(line + ".")


def format_problems(
    v: Int8Verdict, originals: list[np.ndarray], q_arrays: list[np.ndarray], q_dtypes: list[str]
) -> None:
    """The handout's format: for every key and value tensor an int8 tensor of round(x /
    scale) clamped to [-127, 127] and its scales, one per (batch, head, token) vector."""
    ints = [a for a, d in zip(q_arrays, q_dtypes, strict=True) if d == "int8"]
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
        return
    for i, x in enumerate(originals):
        what = f"layer {i // 2}'s {'keys' if i % 2 == 0 else 'values'}"
        q_want, s_want = expected_int8(x)
        if not any(same_int8(a, q_want) for a in ints):
            v.problems.append(
                f"The int8 tensor of {what} {x.shape} is not round(x / scale) clamped to "
                "[-127, 127] with scale = max|x| / 127 for every (batch, head, token) "
                "vector, as the handout asks."
            )
            if any(clamped_short(a, q_want) for a in ints):
                v.problems[-1] += (
                    " The largest |x| of a vector is scale x 127 and must come out as ±127, "
                    "one level further than your values."
                )
            elif mistake := int8_mistake(x, ints):
                v.mistakes.append(mistake)
            return
        zero = np.abs(x.astype(np.float32)).max(axis=-1, keepdims=True) == 0
        if not any(scales_match(a, s_want, zero) for a in floats):
            v.problems.append(
                f"No stored scales match {what}: one max|x| / 127 per (batch, head, "
                f"token), {s_want.size} of them."
            )
            if any(scales_match(a, s_want, zero, guarded=False) for a in floats):
                v.problems[-1] += (
                    " Those of its all-zero vectors are 0 (or not finite): x / scale is then "
                    "0 / 0; the handout stores a scale of 1 where max|x| is 0."
                )
            return


def scales_match(got: np.ndarray, want: np.ndarray, zero: np.ndarray, guarded: bool = True) -> bool:
    """``got`` holds ``want``'s scales (float16 rounding apart). Where the vector is all
    zeros the handout stores 1, but any positive finite scale undoes the zeros as well
    and is accepted; ``guarded=False`` ignores those places (to tell a missing guard)."""
    if got.size != want.size:
        return False
    got, want, zero = got.reshape(-1), want.astype(np.float32).reshape(-1), zero.reshape(-1)
    close = np.isclose(got, want, rtol=SCALE_RTOL, atol=0)
    usable = np.isfinite(got) & (got > 0) if guarded else np.ones_like(zero)
    return bool(np.where(zero, usable, close).all())


def clamped_short(got: np.ndarray, want: np.ndarray) -> bool:
    """``got`` is ``want`` but for values one level short of ±127 at vectors' extremes
    (a clamp to 126 on one side)."""
    if got.shape != want.shape:
        return False
    diff = got.astype(np.int32) - want.astype(np.int32)
    extreme = np.abs(want.astype(np.int32)) == 127
    return bool(diff.any() and not diff[~extreme].any() and (np.abs(diff[extreme]) <= 1).all())


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


def restored_dtypes(header: dict[str, Any]) -> list[str]:
    """The dtypes (torch's names) of the keys and values ``dequantize_kv_int8`` gave back,
    as the worker listed them ([] if the list is malformed)."""
    dtypes = header.get("deq_dtypes")
    if isinstance(dtypes, list) and all(isinstance(d, str) for d in dtypes):
        return dtypes
    return []
