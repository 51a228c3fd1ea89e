"""Points for every graded check, in one place.

Keys are the check numbers shown on Gradescope; a part's total is the sum of
its checks. Reweighting a check (or a part) is an edit here and nowhere else.
"""

from __future__ import annotations

POINTS: dict[str, dict[str, float]] = {
    "part1": {
        "1.1": 2,  # param_count
        "1.2": 1,  # weight_bytes
        "1.3": 2,  # kv_cache_bytes_per_request
        "1.4": 2,  # max_batch_size, one GPU
        "1.5": 2,  # max_batch_size under tensor parallelism
        "1.6": 1,  # attention_flops
        "1.7": 2,  # attention_bytes
        "1.8": 1,  # arithmetic_intensity
        "1.9": 1,  # decode AI does not change with batch
        "1.10": 1,  # answer_table
        "1.11": 1,  # the two plots
        "1.12": 2,  # hidden random specs: memory functions
        "1.13": 2,  # hidden random shapes: attention functions
    },
    "part2": {
        "2.1": 1,  # the course state dict loads
        "2.2": 4,  # logits without the cache (public)
        "2.3": 3,  # with the cache, full sequence, and the cache's shapes (public)
        "2.4": 4,  # one token at a time with the cache (public)
        "2.5": 3,  # prefill then chunks of several tokens (public)
        "2.6": 2,  # hidden: other weights and sizes, batches, long sequences, no cache
        "2.7": 3,  # hidden: the same with the cache
        "2.8": 2,  # generate: same tokens with and without the cache
        "2.9": 3,  # generate: one new token per cached forward call
        "2.10": 2,  # generate: temperature honoured
        "2.11": 3,  # benchmark: cached speedup after a long prompt (timed by the grader)
    },
    "part3": {
        "3.1": 2,  # Llama.build: Meta's checkpoint layout, clear errors
        "3.2": 4,  # forward logits from position 0, cache off
        "3.3": 4,  # forward with the cache: one token per call, chunks at start_pos > 0
        "3.4": 3,  # hidden: other sizes and weights, batches, long sequences
        "3.5": 4,  # greedy generation: reference text with and without the cache
        "3.6": 2,  # per-step logits of the two modes agree
        "3.7": 3,  # call pattern: one token per decode step with the cache
        "3.8": 2,  # a second generate is not polluted by the first
        "3.9": 2,  # hidden: greedy generation on the hidden model
        "3.10": 2,  # sample_top_p keeps exactly the nucleus
        "3.11": 2,  # benchmark: cached vs cache-free speed for batch 1, 8, 16
    },
    "part4": {
        "4.1": 2,  # model_config_summary
        "4.2": 4,  # public and hidden prompts: cached and cache-free greedy tokens
        "4.3": 3,  # public and hidden prompts: per-step logits of the cached path
        "4.4": 3,  # theoretical_kv_bytes on public and hidden random inputs
        "4.5": 3,  # measured_kv_bytes: the real size of the cache
        "4.6": 3,  # latency: cached flat, cache-free growing, cached faster (timed by the grader)
        "4.8": 2,  # measure_latency: ms per token of the timed runs, warm-up left out
    },
}


# Extra credit: checks whose maximum is 0 and which award these points when passed.
BONUS: dict[str, float] = {
    "4.7": 4,  # an int8 KV cache
}


def bonus_total(part: str) -> float:
    """Extra-credit points a part can award beyond its maximum."""
    return float(sum(v for k, v in BONUS.items() if part_of(k) == part))


def part_of(number: str) -> str:
    """``"1.4"`` -> ``"part1"``."""
    return f"part{number.split('.')[0]}"


def points(number: str) -> float:
    """The weight of check ``number``."""
    return float(POINTS[part_of(number)][number])


def part_total(part: str) -> float:
    """Maximum score of a part."""
    return float(sum(POINTS[part].values()))
