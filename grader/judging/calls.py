"""What a cached generation's forward calls must look like, for the parts' benchmark checks:
the prompt fed once (in one call or in chunks), then one token per call. A cache that
starts over every few steps, or feeds its last few tokens again, recomputes part of the
work even when its tokens and its speedup look right. The record of the calls comes from
the worker, so it names an honest design's cost; the work the grader measures is judged
apart."""

from __future__ import annotations

from typing import Any


def fed_once(lengths: list[int], prompt_len: int) -> bool:
    """Whether forward calls that received ``lengths`` tokens fed a ``prompt_len``-token
    prompt once and then one token per call."""
    fed, prefill = 0, 0
    while prefill < len(lengths) and fed < prompt_len:
        fed += lengths[prefill]
        prefill += 1
    return fed == prompt_len and all(x == 1 for x in lengths[prefill:])


def shown(lengths: list[Any], most: int = 12) -> str:
    """``lengths`` (numbers, or already worded items such as ``"(0, 128)"``) for a message,
    as a bracketed list cut after ``most`` entries; items are written as they are, never
    as Python's repr (no quotes around a worded item)."""
    items = [str(x) for x in lengths[:most]] + (["..."] if len(lengths) > most else [])
    return "[" + ", ".join(items) + "]"
