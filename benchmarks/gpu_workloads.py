"""How candidate benchmark workloads separate a working KV cache from its absence on a GPU.

    python benchmarks/gpu_workloads.py [--device cuda] [--repeats 5] [--quick]
                                       [--out results/gpu_workloads.json]

For each part's benchmark, and for each candidate size of its model and workload,
the reference solution's cached generation is timed against its cache-free
generation and against two partial caches (the designs the graded checks must
fail): one that recomputes the whole prefix every 8th step, one that re-feeds
the last 16 tokens at every step. Times are taken around whole generations with
the device synchronised, interleaved, medians of ``--repeats``; peak memory is
``torch.cuda.max_memory_allocated`` reset per run. The figures choose the
``[cuda.*]`` workloads of ``grader/core/thresholds.toml``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "solution"))

from kv_lab import generate_no_cache, generate_with_cache  # noqa: E402
from transformer_skeleton import DecoderOnlyTransformer  # noqa: E402

from llama.model import Llama, ModelArgs  # noqa: E402

RECOMPUTE_EVERY = 8  # the partial cache that starts over every 8th step
REFEED = 16  # the partial cache that re-feeds the last 16 tokens
GREEDY = 1e-5  # Part 2's generate samples; at this temperature it takes the top token


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[float, float]:
    """(seconds, peak bytes) of one call, the device drained before and after."""
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    return seconds, peak


def compare(variants: dict[str, Callable[[], Any]], device: str, repeats: int) -> dict[str, Any]:
    """Median seconds and peak bytes per variant: one warm-up, then interleaved rounds."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for round_ in range(repeats + 1):
        for name, fn in variants.items():
            result = timed(fn, device)
            if round_:
                runs[name].append(result)
    out = {}
    for name, rs in runs.items():
        times = [t for t, _ in rs]
        out[name] = {"median_s": statistics.median(times), "min_s": min(times),
                     "max_s": max(times), "peak_bytes": max(p for _, p in rs)}  # fmt: skip
    return out


# ------------------------------------------------------------------ Part 2


def part2_variants(model: DecoderOnlyTransformer, prompt: torch.Tensor, n: int):
    @torch.no_grad()
    def partial(every: int | None, refeed: int | None) -> torch.Tensor:
        tokens, past = prompt, None
        for step in range(n):
            if past is None or (every and step % every == 0):
                logits, past = model(tokens, use_cache=True)
            elif refeed:
                keep = [(k[:, : -refeed + 1], v[:, : -refeed + 1]) for k, v in past]
                logits, past = model(tokens[:, -refeed:], past_kv=keep, use_cache=True)
            else:
                logits, past = model(tokens[:, -1:], past_kv=past, use_cache=True)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
        return tokens

    return {
        "cached": lambda: model.generate(prompt, n, GREEDY, use_cache=True),
        "cache_free": lambda: model.generate(prompt, n, GREEDY, use_cache=False),
        f"recompute_every_{RECOMPUTE_EVERY}": lambda: partial(RECOMPUTE_EVERY, None),
        f"refeed_last_{REFEED}": lambda: partial(None, REFEED),
    }


def part2(sizes, device: str, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for d, layers, prompt_len, n in sizes:
        torch.manual_seed(0)
        model = DecoderOnlyTransformer(1000, d, 4 * d, layers, prompt_len + n + 1)
        model = model.to(device).eval()
        prompt = torch.randint(0, 1000, (1, prompt_len), device=device)
        res = compare(part2_variants(model, prompt, n), device, repeats)
        rows.append({"part": 2, "d_model": d, "layers": layers, "prompt_len": prompt_len,
                     "new_tokens": n, "batch": 1, "runs": res})  # fmt: skip
        report(rows[-1])
        del model
    return rows


# ------------------------------------------------------------------ Part 3


def part3_variants(model: Llama, prompts: list[list[int]], n: int, device: str):
    def run(kv: bool) -> Callable[[], Any]:
        return lambda: model.generate_tokens(prompts, n, 0.0, 1.0, kv, device, -1, {-5})

    @torch.inference_mode()
    def every(k: int) -> Any:
        tokens = torch.tensor(prompts, device=device)
        model.set_kv_caching(True)
        start = 0
        for step in range(n):
            logits = model(tokens, 0) if step % k == 0 else model(tokens[:, start:], start)
            start = tokens.shape[1]
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], 1)
        return tokens

    return {"cached": run(True), "cache_free": run(False),
            f"recompute_every_{RECOMPUTE_EVERY}": lambda: every(RECOMPUTE_EVERY)}  # fmt: skip


def part3(sizes, batches, device: str, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for dim, layers, heads, kv_heads, input_len, n in sizes:
        args = ModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                         vocab_size=8192, max_batch_size=max(batches),
                         max_seq_len=input_len + n + 1)  # fmt: skip
        torch.manual_seed(0)
        with torch.device(device):
            model = Llama(args)
        model = model.eval()
        for b in batches:
            g = torch.Generator().manual_seed(b)
            prompts = torch.randint(1, 8192, (b, input_len), generator=g).tolist()
            res = compare(part3_variants(model, prompts, n, device), device, repeats)
            rows.append({"part": 3, "dim": dim, "layers": layers, "n_heads": heads,
                         "n_kv_heads": kv_heads, "input_len": input_len, "output_len": n,
                         "batch": b, "runs": res})  # fmt: skip
            report(rows[-1])
        del model
    return rows


# ------------------------------------------------------------------ Part 4


def part4(sizes, device: str, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for n_embd, n_layer, n_head, prompt_len, L_values in sizes:
        rows += part4_size(n_embd, n_layer, n_head, prompt_len, L_values, device, repeats)
    return rows


def part4_size(n_embd, n_layer, n_head, prompt_len, L_values, device, repeats):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    positions = prompt_len + max(L_values) + 1
    config = GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head, n_positions=positions)
    model = GPT2LMHeadModel(config).to(device).eval()
    ids = torch.randint(0, config.vocab_size, (1, prompt_len), device=device)
    no_cache = torch.no_grad()(generate_no_cache)
    rows = []
    for L in L_values:
        variants = {
            "cached": lambda L=L: generate_with_cache(model, ids, L),
            "cache_free": lambda L=L: no_cache(model, ids, L),
        }
        res = compare(variants, device, repeats)
        rows.append({"part": 4, "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head,
                     "prompt_len": prompt_len, "L": L, "batch": 1, "runs": res})  # fmt: skip
        report(rows[-1])
    return rows


def report(row: dict[str, Any]) -> None:
    shape = {k: v for k, v in row.items() if k != "runs"}
    runs = row["runs"]
    cached = runs["cached"]["median_s"]
    parts = [f"{name} {r['median_s'] * 1e3:.1f} ms ({r['min_s'] * 1e3:.1f}-"
             f"{r['max_s'] * 1e3:.1f}) x{r['median_s'] / cached:.2f} "
             f"peak {r['peak_bytes'] / 2**20:.0f} MiB" for name, r in runs.items()]  # fmt: skip
    print(json.dumps(shape), "|", "; ".join(parts), flush=True)


# Candidates, per part: Part 2 (d_model, layers, prompt, new tokens); Part 3 (dim, layers,
# heads, kv heads, input, output) and its batch sizes; Part 4 (n_embd, n_layer, n_head,
# prompt, L values).
SIZES: dict[str, tuple[list, list, list, list]] = {
    "tiny": ([(64, 2, 64, 4)], [(64, 2, 4, 2, 32, 4)], [1, 2], [(64, 2, 4, 4, [4, 8])]),
    "sweep": (
        [(1024, 8, 2000, 16), (2048, 8, 2000, 16), (1024, 16, 4000, 16)],
        [(1024, 8, 16, 4, 1024, 16), (2048, 8, 16, 4, 2048, 16)],
        [1, 8, 16],
        [(768, 6, 12, 8, [32, 256]), (1024, 24, 16, 8, [32, 512, 1024])],
    ),
    "chosen": (
        [(2048, 8, 2000, 32)],
        [(1024, 8, 16, 4, 1024, 32)],
        [1, 8, 16],
        [(2048, 6, 16, 8, [32, 512]), (2560, 4, 20, 8, [32, 512])],
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", default="2,3,4")
    parser.add_argument(
        "--sizes",
        choices=sorted(SIZES),
        default="chosen",
        help="which candidates: the first sweep, the chosen ones, or tiny",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_workloads.json"))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as students run it
    p2, p3, b3, p4 = SIZES[args.sizes]
    rows: list[dict[str, Any]] = []
    wanted = set(args.parts.split(","))
    if "2" in wanted:
        rows += part2(p2, args.device, args.repeats)
    if "3" in wanted:
        rows += part3(p3, b3, args.device, args.repeats)
    if "4" in wanted:
        rows += part4(p4, args.device, args.repeats)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": gpu, "torch": torch.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
