"""The reference Llama's cached decode against this machine's memory bandwidth, and
against Hugging Face transformers' ``LlamaForCausalLM`` with the same weights.

    python benchmarks/reference_mbu.py [--dtype float32|bfloat16] [--new-tokens 32]
                                       [--device cpu|cuda] [--out results/mbu.json]

Decoding one token with the cache reads every weight once (the embedding table
excepted: one row) plus the cached keys and values so far, and does little
arithmetic per byte: it is bound by memory bandwidth. Model bandwidth
utilisation (MBU, as gpt-fast reports it) is

    bytes read per decoded token x decoded tokens per second / bandwidth,

where the bandwidth is measured in the same run as STREAM measures it: the best of
its copy, scale, add and triad kernels (bytes read + bytes written per second). The
model is randomly initialised with the Llama-3.2-1B shape (1.24 B parameters: 4.9 GB
in float32), far larger than any CPU cache. Both implementations get the same weights (Meta's q/k
layout permuted to Hugging Face's rotate-half layout) and decode greedily from
the same prompt; their tokens must agree.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "solution"))
sys.path.insert(0, str(ROOT))

from benchmark_inference import LLAMA32_1B_PARAMS  # noqa: E402

from grader.runtime.timing import Ratio, Sample, interleaved  # noqa: E402
from llama.model import Llama, ModelArgs, precompute_freqs_cis  # noqa: E402

# Llama-3.2-1B's params.json, as the course harness states it.
LLAMA_32_1B = json.loads(LLAMA32_1B_PARAMS)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def stream_kernels(device: str, gib: float = 1.0) -> dict[str, float]:
    """Bytes per second of STREAM's four kernels on fresh ``gib`` buffers: copy (a = b),
    scale (a = q b), add (a = b + c) and triad (a = b + q c), counting every byte read
    and written once. The machine's bandwidth is the best of them."""
    n = int(gib * 2**30) // 4
    a, b, c = (torch.ones(n, dtype=torch.float32, device=device) for _ in range(3))
    kernels = {
        "copy": (lambda: a.copy_(b), 2),
        "scale": (lambda: torch.mul(b, 3.0, out=a), 2),
        "add": (lambda: torch.add(b, c, out=a), 3),
        "triad": (lambda: torch.add(b, c, alpha=3.0, out=a), 3),
    }
    rates = {}
    for name, (kernel, arrays) in kernels.items():
        kernel()  # written once already: no page faults in the timed run
        sync(device)
        start = time.perf_counter()
        kernel()
        sync(device)
        rates[name] = arrays * n * 4 / (time.perf_counter() - start)
    return rates


def build_reference(
    dtype: torch.dtype, device: str, max_seq_len: int, shape: dict | None = None, seed: int = 0
) -> Llama:
    """The course's reference Llama with seeded random weights (of the 1B shape)."""
    args = ModelArgs(**(shape or LLAMA_32_1B), max_batch_size=1, max_seq_len=max_seq_len)
    with torch.device("meta"):
        model = Llama(args)
    model = model.to_empty(device=device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                std = 0.02 if "output" not in name else 0.5 / args.dim**0.5 * 8
                p.copy_(torch.randn(p.shape, generator=generator) * std)
    head_dim = args.dim // args.n_heads
    model.freqs_cis = precompute_freqs_cis(head_dim, 2 * max_seq_len, args.rope_theta, True)
    return model.to(dtype).eval()


def permute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Meta's interleaved-pair rotary layout of wq/wk rows to Hugging Face's halves."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def build_hf(reference: Llama, dtype: torch.dtype, device: str):
    """``LlamaForCausalLM`` with the same configuration and weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    a = reference.params
    ffn = reference.layers[0].feed_forward.w1.out_features
    config = LlamaConfig(
        vocab_size=a.vocab_size, hidden_size=a.dim, intermediate_size=ffn,
        num_hidden_layers=a.n_layers, num_attention_heads=a.n_heads,
        num_key_value_heads=a.n_kv_heads, rms_norm_eps=a.norm_eps,
        max_position_embeddings=131072, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": a.rope_theta, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    )  # fmt: skip
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    hf = hf.to_empty(device=device)
    # The rotary frequencies are buffers computed at construction, not weights.
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config).to(device)
    kv_heads = a.n_kv_heads
    state = {
        "model.embed_tokens.weight": reference.tok_embeddings.weight,
        "model.norm.weight": reference.norm.weight,
        "lm_head.weight": reference.output.weight,
    }
    for i, layer in enumerate(reference.layers):
        at, ff, p = layer.attention, layer.feed_forward, f"model.layers.{i}."
        state |= {
            p + "self_attn.q_proj.weight": permute_rotary(at.wq.weight, a.n_heads),
            p + "self_attn.k_proj.weight": permute_rotary(at.wk.weight, kv_heads),
            p + "self_attn.v_proj.weight": at.wv.weight,
            p + "self_attn.o_proj.weight": at.wo.weight,
            p + "mlp.gate_proj.weight": ff.w1.weight,
            p + "mlp.down_proj.weight": ff.w2.weight,
            p + "mlp.up_proj.weight": ff.w3.weight,
            p + "input_layernorm.weight": layer.attention_norm.weight,
            p + "post_attention_layernorm.weight": layer.ffn_norm.weight,
        }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return hf.to(dtype).eval()


@torch.inference_mode()
def decode_reference(model: Llama, prompt: torch.Tensor, n: int, device: str):
    """Greedy tokens and decode seconds (prefill excluded) through the reference cache."""
    logits = model(prompt, 0)
    token = logits[:, -1].argmax(-1, keepdim=True)  # (1, 1)
    tokens, pos = [token], prompt.shape[1]
    sync(device)
    start = time.perf_counter()
    for _ in range(n - 1):
        token = model(token, pos)[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
        pos += 1
    sync(device)
    return torch.cat(tokens, 1), time.perf_counter() - start


@torch.inference_mode()
def decode_hf(model, prompt: torch.Tensor, n: int, device: str):
    """The same through transformers' own KV cache (``DynamicCache``)."""
    out = model(input_ids=prompt, use_cache=True)
    cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    tokens = [token]
    sync(device)
    start = time.perf_counter()
    for _ in range(n - 1):
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    sync(device)
    return torch.cat(tokens, 1), time.perf_counter() - start


def bytes_per_token(model: Llama, context: float, dtype: torch.dtype) -> float:
    """Bytes one decode step reads at ``context`` cached positions: every weight but the
    embedding table (one row of it), and the cached keys and values."""
    size = torch.tensor([], dtype=dtype).element_size()
    params = sum(p.numel() for n, p in model.named_parameters() if n != "tok_embeddings.weight")
    a = model.params
    kv = 2 * a.n_layers * context * a.n_kv_heads * (a.dim // a.n_heads)
    return (params + a.dim + kv) * size


def profile_decode(model: Llama, prompt: torch.Tensor, device: str, top: int) -> list[dict]:
    """The ``top`` operators by device time over 8 decode steps: where a decode step's
    time goes (which kernels, how many launches)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        decode_reference(model, prompt, 9, device)
    key = "device_time_total" if device == "cuda" else "cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    rows = [{"name": e.key[:80], "calls": e.count, "ms": getattr(e, key) / 1e3} for e in events]
    for row in rows[:top]:
        print(f"  {row['ms']:9.2f} ms  {row['calls']:6d} calls  {row['name']}")
    return rows[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (medians)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: all)")
    parser.add_argument("--skip-hf", action="store_true", help="only the reference and MBU")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print the N kernels that take the most device time in decode",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "mbu.json"))
    args = parser.parse_args()
    dtype, device = getattr(torch, args.dtype), args.device
    if args.threads:
        torch.set_num_threads(args.threads)

    model = build_reference(dtype, device, args.prompt_len + args.new_tokens + 8)
    prompt = torch.randint(0, model.params.vocab_size, (1, args.prompt_len),
                           generator=torch.Generator().manual_seed(1)).to(device)  # fmt: skip
    decoders = {"reference": lambda: decode_reference(model, prompt, args.new_tokens, device)}
    if not args.skip_hf:
        hf = build_hf(model, dtype, device)
        decoders["transformers"] = lambda: decode_hf(hf, prompt, args.new_tokens, device)
    tokens: dict[str, torch.Tensor] = {}
    streams: list[dict[str, float]] = []  # bytes per second of each round's kernels

    def run(name: str, i: int) -> Sample:
        if name == "stream":  # the machine's bandwidth, measured between the decodes
            rates = stream_kernels(device)
            streams.append(rates)
            return Sample(sum(1 / r for r in rates.values()))
        tokens[name], seconds = decoders[name]()
        return Sample(seconds)

    # The same harness as the graded checks: a warm-up, then interleaved rounds, medians.
    # The order rotates: neither decoder always runs right after the kernels.
    timings = interleaved(run, ["stream", *decoders], warmup=1, repeats=args.repeats, rotate=True)
    # The warm-up round's kernels left out; per kernel the median of the rounds, and
    # the bandwidth is the best kernel's.
    kernel_rates = {k: statistics.median(r[k] for r in streams[1:]) for k in streams[0]}
    bandwidth = max(kernel_rates.values())
    steps = args.new_tokens - 1
    ref = timings["reference"]
    tok_s = steps / ref.median
    mean_context = args.prompt_len + 1 + (steps - 1) / 2
    moved = bytes_per_token(model, mean_context, dtype)
    mbu = moved * tok_s / bandwidth
    print(
        f"bandwidth: {bandwidth / 1e9:.1f} GB/s, the best of STREAM's kernels ("
        + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in kernel_rates.items())
        + f"; medians of {args.repeats}; {torch.get_num_threads()} threads)"
    )
    print(f"reference Llama ({args.dtype}): {tok_s:.2f} tokens/s (spread {ref.spread:.0%}), "
          f"{moved / 1e9:.2f} GB/token, MBU {mbu:.0%}")  # fmt: skip
    result = {
        "device": device, "dtype": args.dtype, "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
        "bandwidth_gb_s": bandwidth / 1e9,
        "stream_gb_s": {k: v / 1e9 for k, v in kernel_rates.items()}, "bytes_per_token": moved,
        "reference_tokens_per_s": tok_s, "mbu": mbu, "repeats": args.repeats,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
    }  # fmt: skip
    if "transformers" in decoders:
        speed = Ratio.of(timings["transformers"], ref)  # > 1: the reference is faster
        same = bool(torch.equal(tokens["transformers"], tokens["reference"]))
        agree = (tokens["transformers"] == tokens["reference"]).float().mean().item()
        result |= {"hf_tokens_per_s": steps / timings["transformers"].median,
                   "speed_ratio": speed.median, "speed_ratio_range": [speed.low, speed.high],
                   "same_greedy_tokens": same, "token_agreement": agree}  # fmt: skip
        print(f"transformers LlamaForCausalLM: {result['hf_tokens_per_s']:.2f} tokens/s; "
              f"reference / transformers speed {speed}; same greedy tokens: {same} "
              f"({agree:.0%})")  # fmt: skip
    if args.profile:
        result["top_kernels"] = profile_decode(model, prompt, device, args.profile)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
