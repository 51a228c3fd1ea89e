"""Part 4: the KV-cache lab on a distilgpt2-shaped model.

Greedy decoding through Hugging Face ``transformers``, once re-reading the whole
sequence every step and once through the KV cache; the latency of both against
the number of generated tokens L; the cache's size in theory (2 · L · D · N_L ·
bytes) and in fact; and, as the bonus, an int8 cache with scaled symmetric
quantisation whose memory, reconstruction error and effect on the tokens are
measured.

The real distilgpt2 weights are used when they are in the local Hugging Face
cache. Otherwise (no network is ever tried) a randomly initialised GPT-2 of the
same shape stands in: latency and cache size depend on the shape, not on the
weights.

    python kv_lab.py --report OUT_DIR [--device cpu|cuda] [--quick] [--rounds N]
"""

# BEGIN PROMPT
# # Every function whose body raises NotImplementedError is yours (TODO 1-5, the steps are
# # in its comments); keep its name and signature, the autograder calls it. load_model,
# # the helpers, report() and the command line are provided.
# END PROMPT

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

# distilgpt2's shape: 6 layers, hidden size 768, 12 heads of 64, GPT-2's vocabulary.
DISTILGPT2 = dict(n_layer=6, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
L_VALUES = (32, 64, 128, 256)  # the lab's sequence lengths
QUICK_L_VALUES = (4, 8, 16)  # --quick: a check that everything runs
INT8_NEW_TOKENS = 64  # greedy tokens compared with and without the int8 cache

# ----------------------------------------------------------------------------- Task 1


def load_model(name: str = "distilgpt2", device: str = "cpu") -> torch.nn.Module:
    """The model in eval mode on ``device``: real weights if cached locally, else random ones.

    ``local_files_only=True`` means a machine without the weights (or without a network)
    fails fast instead of trying to download. ``dtype`` is pinned to fp32 because
    transformers 5 otherwise loads a checkpoint in the dtype it was saved in. The fallback
    is seeded so that every run builds the same model; ``model.random_weights`` says which.
    """
    try:
        model = GPT2LMHeadModel.from_pretrained(name, local_files_only=True, dtype=torch.float32)
        random_weights = False
    except (OSError, ValueError):
        print(
            f"kv_lab: no local weights for {name!r}; using a randomly initialised "
            "distilgpt2-shaped GPT-2 (seed 0) instead",
            file=sys.stderr,
        )
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(**DISTILGPT2))
        random_weights = True
    model.random_weights = random_weights
    return model.to(device).eval()


def model_config_summary(model: torch.nn.Module) -> dict[str, int]:
    """The sizes that set the cost of decoding and the size of the cache (Task 1)."""
    # BEGIN SOLUTION
    cfg = model.config
    return {
        "n_layers": int(cfg.n_layer),
        "hidden_size": int(cfg.n_embd),
        "n_heads": int(cfg.n_head),
        "vocab_size": int(cfg.vocab_size),
        "n_positions": int(cfg.n_positions),
    }
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. The sizes live in model.config (a GPT2Config): n_layer, n_embd, n_head,
    # #    vocab_size and n_positions.
    # # 2. Return them as Python ints under the keys n_layers, hidden_size, n_heads,
    # #    vocab_size and n_positions.
    # raise NotImplementedError("TODO 1: model_config_summary")
    # END PROMPT


# ------------------------------------------------------------------------ Tasks 2 and 3


@torch.no_grad()
def generate_no_cache(model: torch.nn.Module, input_ids: torch.Tensor, L: int) -> torch.Tensor:
    """Append ``L`` greedy tokens, feeding the whole sequence so far at every step (Task 2).

    Step t attends over T + t tokens from scratch, so one step costs O(T + t) and the
    whole generation O((T + L)^2): nothing computed for earlier tokens is kept.
    """
    # BEGIN SOLUTION
    ids = input_ids  # (B, T)
    for _ in range(L):
        logits = model(ids, use_cache=False).logits  # (B, T_so_far, V)
        next_id = logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, next_id], dim=1)
    return ids  # (B, T + L)
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. ids = input_ids; repeat L times:
    # # 2.   logits = model(ids, use_cache=False).logits           # (B, T_so_far, V)
    # # 3.   the next token is the argmax of the last position's logits, kept as (B, 1)
    # # 4.   append it to ids with torch.cat along dim 1 (never modify input_ids in place)
    # # 5. Return ids, (B, T + L). Each step must feed the WHOLE sequence so far.
    # raise NotImplementedError("TODO 2: generate_no_cache")
    # END PROMPT


@torch.no_grad()
def generate_with_cache(model: torch.nn.Module, input_ids: torch.Tensor, L: int) -> torch.Tensor:
    """Append ``L`` greedy tokens through the KV cache (Task 3).

    The prompt goes through the model once (prefill) and fills the cache; every later
    step feeds only the newest token, whose query attends over the cached keys/values.
    """
    # BEGIN SOLUTION
    return generate_with_cache_from(model, input_ids, None, L)
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. Either write the loop here, or write it once in generate_with_cache_from and
    # #    call that with past_key_values=None.
    # # 2. The first call feeds the whole prompt with use_cache=True and keeps
    # #    out.past_key_values (the cache of every token fed so far).
    # # 3. Every later call feeds ONLY the newest token, shape (B, 1), with
    # #    past_key_values= the cache the previous call returned.
    # # 4. Greedy: the argmax of the last position's logits. Return (B, T + L): exactly
    # #    L calls to the model, one per generated token.
    # raise NotImplementedError("TODO 3: generate_with_cache")
    # END PROMPT


@torch.no_grad()
def generate_with_cache_from(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    past_key_values: DynamicCache | None,
    L: int,
) -> torch.Tensor:
    """Greedy decoding that continues from a cache holding the first tokens of ``input_ids``.

    The first call feeds the tokens the cache does not hold yet (the whole prompt when it
    is empty), every later call the one token just chosen. The cache is the object the
    model returned: a ``DynamicCache``, extended in place. Used for the int8 comparison.
    """
    # BEGIN SOLUTION
    past_len = 0 if past_key_values is None else past_key_values.get_seq_length()
    if past_len >= input_ids.shape[1]:
        raise ValueError("the cache must hold fewer tokens than input_ids (one at least to feed)")
    ids, new = input_ids, input_ids[:, past_len:]  # (B, T), (B, T - past_len)
    cache = past_key_values
    for _ in range(L):
        out = model(new, past_key_values=cache, use_cache=True)
        cache = out.past_key_values  # now holds every token fed so far
        new = out.logits[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        ids = torch.cat([ids, new], dim=1)
    return ids  # (B, T + L)
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. past_len = the number of tokens the cache holds (0 for None; a DynamicCache
    # #    has get_seq_length()).
    # # 2. The first call feeds input_ids[:, past_len:], the tokens not cached yet.
    # # 3. Then the loop of generate_with_cache: one new token per call, passing the
    # #    cache returned by the previous call. Return (B, T + L).
    # raise NotImplementedError("TODO 3: generate_with_cache_from")
    # END PROMPT


def cuda_sync(device: str | torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the work and not its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure_latency(
    model: torch.nn.Module,
    L_values: tuple[int, ...] = L_VALUES,
    prompt_len: int = 8,
    warmup: int = 1,
    repeats: int = 3,
    device: str = "cpu",
) -> dict[str, list]:
    """Milliseconds per generated token with and without the cache, for each L.

    Each figure is the median over ``repeats`` timed runs (after ``warmup`` untimed
    ones) of one whole generation divided by L. Both modes get the same seeded prompt.
    """
    # BEGIN SOLUTION
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=gen)
    prompt = prompt.to(device)  # (1, prompt_len)
    result: dict[str, list] = {"L": [], "no_cache_ms_per_token": [], "cache_ms_per_token": []}
    modes = (
        ("no_cache_ms_per_token", generate_no_cache),
        ("cache_ms_per_token", generate_with_cache),
    )
    for L in L_values:
        result["L"].append(int(L))
        for key, generate in modes:
            times = []
            for i in range(warmup + repeats):
                cuda_sync(device)
                start = time.perf_counter()
                generate(model, prompt, L)
                cuda_sync(device)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
            result[key].append(statistics.median(times) * 1000 / L)
    return result
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. A seeded random prompt of prompt_len tokens on `device`, shape (1, prompt_len).
    # # 2. For each L, for generate_no_cache and for generate_with_cache: run it
    # #    warmup + repeats times; time each run with time.perf_counter(), calling
    # #    cuda_sync(device) before starting and before stopping the clock; keep the
    # #    runs after the warm-up.
    # # 3. ms per token = median of the kept times (statistics.median) * 1000 / L.
    # # 4. Return {"L": [...], "no_cache_ms_per_token": [...],
    # #            "cache_ms_per_token": [...]}, one entry per L, in the order given.
    # raise NotImplementedError("TODO 2/3: measure_latency")
    # END PROMPT


# ----------------------------------------------------------------------------- Task 4


def theoretical_kv_bytes(L: int, D: int, n_layers: int, bytes_per_elem: int = 2) -> int:
    """Bytes of a KV cache of L tokens: K and V (2), each D wide, in every layer."""
    # BEGIN SOLUTION
    return int(2 * L * D * n_layers * bytes_per_elem)
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. K and V (2) x L tokens x D values per token x n_layers x bytes_per_elem.
    # # 2. Return a Python int.
    # raise NotImplementedError("TODO 4: theoretical_kv_bytes")
    # END PROMPT


def kv_pairs(past_key_values) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(keys, values)] per layer, each (B, H, T, head_dim), whatever the cache's format.

    transformers 5 returns a ``DynamicCache`` whose ``.layers[i].keys``/``.values`` are
    the tensors (iterating over it yields (keys, values, sliding_window) triples);
    older code passes a tuple of (keys, values) per layer. Empty layers are skipped.
    """
    if hasattr(past_key_values, "layers"):
        pairs = [(layer.keys, layer.values) for layer in past_key_values.layers]
    else:
        pairs = [(kv[0], kv[1]) for kv in past_key_values]
    return [(k, v) for k, v in pairs if k is not None and v is not None]


def measured_kv_bytes(past_key_values) -> int:
    """Bytes the cache really holds: numel · element_size of every key and value tensor."""
    # BEGIN SOLUTION
    return sum(t.numel() * t.element_size() for k, v in kv_pairs(past_key_values) for t in (k, v))
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. kv_pairs(past_key_values) gives [(keys, values)] per layer for both formats.
    # # 2. Sum tensor.numel() * tensor.element_size() over every key and value tensor.
    # #    Read the sizes from the tensors: never assume fp16 or a shape.
    # raise NotImplementedError("TODO 4: measured_kv_bytes")
    # END PROMPT


# ------------------------------------------------------------------------ Task 5 (bonus)


def quantize_kv_int8(past_key_values) -> dict:
    """The cache as int8 with one fp16 scale per token and head (symmetric, absmax).

    For every (batch, head, token) vector x of head_dim values: scale = max|x| / 127 and
    q = round(x / scale) in [-127, 127]. Per token because the cache grows a token at a
    time, so a token's scale is fixed when it is appended and never revisited; per head
    because heads have different ranges; symmetric because keys and values are roughly
    centred on zero. The scales cost 2 bytes per head_dim int8 values (3 % for 64).
    A bare ``.to(torch.uint8)`` cast is not a quantisation: it drops the fractions,
    wraps negatives around 256 and keeps no scale to undo either.
    """
    # BEGIN SOLUTION
    pairs = kv_pairs(past_key_values)
    layers = []
    for k, v in pairs:
        entry = {}
        for name, x in (("k", k), ("v", v)):  # x: (B, H, T, head_dim)
            absmax = x.float().abs().amax(dim=-1, keepdim=True)  # (B, H, T, 1)
            scale = (absmax / 127).clamp(max=65504).to(torch.float16)
            scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # all-zero vectors
            q = torch.round(x.float() / scale.float()).clamp(-127, 127).to(torch.int8)
            entry[name], entry[f"{name}_scale"] = q, scale
        layers.append(entry)
    dtype = pairs[0][0].dtype if pairs else torch.float32
    return {"layers": layers, "dtype": str(dtype).removeprefix("torch.")}
    # END SOLUTION
    # BEGIN PROMPT
    # # For each layer's keys and values x, (B, H, T, head_dim):
    # # 1. absmax = max |x| over the last dimension (keepdim)      # (B, H, T, 1)
    # # 2. scale = absmax / 127, stored in float16; use 1 where it is 0
    # # 3. q = round(x / scale), clamped to [-127, 127], as torch.int8
    # # 4. keep q and its scale per layer; also remember x's dtype for dequantize_kv_int8
    # # Return a dict of int8 tensors and fp16 scales (see quantized_kv_bytes).
    # # Not x.to(torch.uint8): that is not a quantisation (see above).
    # raise NotImplementedError("TODO 5 (bonus): quantize_kv_int8")
    # END PROMPT


def dequantize_kv_int8(q: dict) -> DynamicCache:
    """A ``DynamicCache`` of q * scale in the original dtype, usable as past_key_values."""
    # BEGIN SOLUTION
    dtype = getattr(torch, q["dtype"])
    cache = DynamicCache()
    for i, layer in enumerate(q["layers"]):
        k = (layer["k"].float() * layer["k_scale"].float()).to(dtype)  # (B, H, T, head_dim)
        v = (layer["v"].float() * layer["v_scale"].float()).to(dtype)
        cache.update(k, v, i)
    return cache
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. cache = DynamicCache()
    # # 2. for each layer i: k = q_k * k_scale and v = q_v * v_scale, computed in float32
    # #    and cast back to the original dtype; then cache.update(k, v, i)
    # # 3. Return the cache: the model must accept it as past_key_values.
    # raise NotImplementedError("TODO 5 (bonus): dequantize_kv_int8")
    # END PROMPT


def quantized_kv_bytes(q: dict) -> int:
    """Bytes of the int8 cache: the int8 keys and values plus their fp16 scales."""
    # BEGIN SOLUTION
    return sum(t.numel() * t.element_size() for layer in q["layers"] for t in layer.values())
    # END SOLUTION
    # BEGIN PROMPT
    # # 1. Sum numel() * element_size() over every int8 tensor AND every scale in q.
    # raise NotImplementedError("TODO 5 (bonus): quantized_kv_bytes")
    # END PROMPT


def kv_relative_error(reference, restored) -> float:
    """Max over the cache's tensors of max|x - x_hat| / max|x| (the grader's measure)."""
    errors = [
        float((a - b.to(a.dtype)).abs().max() / a.abs().max().clamp_min(1e-12))
        for (ka, va), (kb, vb) in zip(kv_pairs(reference), kv_pairs(restored), strict=True)
        for a, b in ((ka, kb), (va, vb))
    ]
    return max(errors)


# ----------------------------------------------------------------------------- report


@torch.no_grad()
def cache_of(model: torch.nn.Module, L: int, device: str) -> DynamicCache:
    """The cache transformers builds for L (seeded random) tokens of batch 1."""
    gen = torch.Generator().manual_seed(L)
    ids = torch.randint(0, model.config.vocab_size, (1, L), generator=gen).to(device)
    return model(ids, use_cache=True).past_key_values


def memory_table(model: torch.nn.Module, L_values: tuple[int, ...], device: str) -> dict:
    """Theoretical fp16 and fp32 cache bytes against the bytes measured, for each L."""
    s = model_config_summary(model)
    D, n = s["hidden_size"], s["n_layers"]
    return {
        "L": list(L_values),
        "theory_fp16": [theoretical_kv_bytes(L, D, n, 2) for L in L_values],
        "theory_fp32": [theoretical_kv_bytes(L, D, n, 4) for L in L_values],
        "measured": [measured_kv_bytes(cache_of(model, L, device)) for L in L_values],
    }


@torch.no_grad()
def int8_experiment(model: torch.nn.Module, device: str, prompt_len: int = 32) -> dict:
    """Memory, reconstruction error and greedy agreement of the int8 cache of a prompt."""
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=gen).to(device)
    cache = model(prompt[:, :-1], use_cache=True).past_key_values  # all but the last token
    fp16_bytes = sum(t.numel() * 2 for k, v in kv_pairs(cache) for t in (k, v))
    q = quantize_kv_int8(cache)
    restored = dequantize_kv_int8(q)
    error = kv_relative_error(cache, restored)
    ref = generate_with_cache_from(model, prompt, cache, INT8_NEW_TOKENS)[:, prompt_len:]
    got = generate_with_cache_from(model, prompt, restored, INT8_NEW_TOKENS)[:, prompt_len:]
    return {
        "int8_bytes": quantized_kv_bytes(q),
        "fp16_bytes": fp16_bytes,
        "ratio": quantized_kv_bytes(q) / fp16_bytes,
        "max_rel_error": error,
        "agreement": float((ref == got).float().mean()),
    }


def plot_latency(latency: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(latency["L"], latency["no_cache_ms_per_token"], "o-", label="without KV cache")
    ax.plot(latency["L"], latency["cache_ms_per_token"], "s-", label="with KV cache")
    ax.set(xlabel="generated tokens L", ylabel="ms / token", title="Greedy decoding latency")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_memory(memory: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kib = [[b / 1024 for b in memory[key]] for key in ("theory_fp16", "theory_fp32", "measured")]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(memory["L"], kib[0], "--", label="theory, fp16 (2 bytes)")
    ax.plot(memory["L"], kib[1], "--", label="theory, fp32 (4 bytes)")
    ax.plot(memory["L"], kib[2], "o", label="measured cache")
    ax.set(xlabel="tokens in the cache L", ylabel="KiB", title="KV cache size")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def repeated_latency(
    model: torch.nn.Module, L_values: tuple[int, ...], rounds: int, device: str
) -> tuple[dict[str, list], list[str]]:
    """``measure_latency`` run ``rounds`` times (one timed run each): the median of every
    figure, and the L values where the runs of the two modes overlap (the slowest cached
    run no faster than the fastest cache-free one), too noisy to compare them."""
    runs = [
        measure_latency(model, L_values, warmup=int(i == 0), repeats=1, device=device)
        for i in range(rounds)
    ]
    latency: dict[str, list] = {"L": list(runs[0]["L"])}
    for key in ("no_cache_ms_per_token", "cache_ms_per_token"):
        latency[key] = [
            statistics.median(run[key][j] for run in runs) for j in range(len(latency["L"]))
        ]
    noisy = [
        f"L = {L}"
        for j, L in enumerate(latency["L"])
        if max(r["cache_ms_per_token"][j] for r in runs)
        >= min(r["no_cache_ms_per_token"][j] for r in runs)
    ]
    return latency, noisy


def latency_verdict(latency: dict[str, list], noisy: list[str]) -> list[str]:
    """Whether the cache won at every L, and which figures were too noisy to say."""
    lines = []
    if noisy:
        lines.append(
            f"WARNING: at {', '.join(noisy)} the timed runs of the two modes overlap: too "
            "noisy to conclude. Close other programs and run again."
        )
    rows = zip(
        latency["L"], latency["no_cache_ms_per_token"], latency["cache_ms_per_token"], strict=True
    )
    lost = [str(L) for L, slow, fast in rows if not fast < slow]
    if lost:
        lines.append(f"The cache was NOT faster at L = {', '.join(lost)}.")
    else:
        lines.append("The cache was faster at every L.")
    return lines


def report(
    out_dir: Path,
    device: str = "cpu",
    L_values: tuple[int, ...] = L_VALUES,
    quick: bool = False,
    rounds: int = 3,
) -> Path:
    """Run Tasks 1-5 and write report.md, latency.png and memory.png to ``out_dir``.

    Each latency figure is the median of ``rounds`` calls of ``measure_latency``; the
    report says when their spread is too large to conclude."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    L_values = QUICK_L_VALUES if quick else tuple(L_values)
    model = load_model(device=device)
    summary = model_config_summary(model)
    latency, noisy = repeated_latency(model, L_values, rounds, device)
    memory = memory_table(model, L_values, device)
    plot_latency(latency, out_dir / "latency.png")
    plot_memory(memory, out_dir / "memory.png")
    try:
        int8 = int8_experiment(model, device)
    except NotImplementedError:
        int8 = None

    weights = "random (no local distilgpt2)" if model.random_weights else "distilgpt2"
    lines = [
        "# KV-cache lab report",
        "",
        f"Device: `{device}`; weights: {weights}; fp32; greedy decoding, batch 1, 8-token prompt.",
        "",
        "## Task 1: model configuration",
        "",
        "| quantity | value |",
        "| --- | --- |",
        *(f"| {key} | {value} |" for key, value in summary.items()),
        "",
        "## Tasks 2 and 3: latency",
        "",
        "| L | no cache (ms/token) | cache (ms/token) | speed-up |",
        "| --- | --- | --- | --- |",
    ]
    rows = zip(
        latency["L"], latency["no_cache_ms_per_token"], latency["cache_ms_per_token"], strict=True
    )
    for L, a, b in rows:
        lines.append(f"| {L} | {a:.2f} | {b:.2f} | {a / b:.1f}x |")
    verdict = latency_verdict(latency, noisy)
    threads = f", {torch.get_num_threads()} CPU thread(s)" if device == "cpu" else ""
    runs = f"Median of {rounds} runs" if rounds > 1 else "One run"
    lines += ["", f"{runs} per figure{threads}. " + " ".join(verdict)]
    print("\n".join(lines[lines.index("## Tasks 2 and 3: latency") :]))
    per_token = theoretical_kv_bytes(1, summary["hidden_size"], summary["n_layers"], 4)
    lines += [
        "",
        "![latency](latency.png)",
        "",
        "## Task 4: KV-cache memory",
        "",
        f"2 · L · D · N_L · bytes: {per_token:,} bytes per token in fp32, half that in fp16.",
        "",
        "| L | theory fp16 | theory fp32 | measured |",
        "| --- | --- | --- | --- |",
    ]
    for L, f16, f32, real in zip(*memory.values(), strict=True):
        lines.append(f"| {L} | {f16:,} | {f32:,} | {real:,} |")
    lines += ["", "![memory](memory.png)", "", "## Task 5 (bonus): int8 KV cache", ""]
    if int8 is None:
        lines.append("Not implemented.")
    else:
        lines += [
            "Symmetric int8, one fp16 scale per token and head (absmax / 127).",
            "",
            f"* memory: {int8['int8_bytes']:,} bytes against {int8['fp16_bytes']:,} in fp16 "
            f"({int8['ratio']:.3f}x)",
            f"* max relative reconstruction error: {int8['max_rel_error']:.3%}",
            f"* greedy agreement with the fp cache: {int8['agreement']:.0%} of "
            f"{INT8_NEW_TOKENS} tokens",
        ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=Path("kv_lab_report"), help="output folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="small L values: a quick run")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="measure_latency calls per figure (default 3)"
    )
    args = parser.parse_args()
    if args.device == "cpu":
        # One thread: at batch 1 the matrices are small, and on a busy laptop more threads
        # mostly add noise (and slow the cache-free path less than the cached one).
        torch.set_num_threads(max(1, args.threads))
    path = report(args.report, device=args.device, quick=args.quick, rounds=max(1, args.rounds))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
