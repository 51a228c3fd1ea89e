"""Part 3: time Llama 3 generation with and without the KV cache, and measure its memory.

``benchmark_inference`` produces the course's record for one run (batch size, prompt and
output lengths, time, tokens per second, weight memory, peak memory, a sample text);
``sweep`` runs both modes over several batch sizes and writes a JSON file, the course
reports' Markdown table and a plot. Usage (from this folder)::

    python benchmark_inference.py                       # tiny checkpoint, batch 1, 8, 16
    python benchmark_inference.py --ckpt-dir ~/.llama/checkpoints/Llama3.2-1B --device cuda
    python benchmark_inference.py --single --batch-size 8 --kv-caching off

On a CPU it uses one thread unless ``--threads`` says otherwise: the tiny checkpoint's
matrices are too small to gain from more, and on a busy laptop extra threads only add
noise. Every figure is the median of ``--repeats`` timed runs; when the runs of the two
modes overlap (their spread is too large to tell which is faster), the table says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import torch

from llama.model import Llama, ModelArgs

HERE = Path(__file__).resolve().parent
STORY = "Once upon a time in a galaxy far away "
MB = 2**20


def default_ckpt_dir() -> Path:
    """The tiny test checkpoint (repository layout first, then next to this script)."""
    in_repo = HERE.parent / "test_cases" / "public" / "part3" / "tiny_llama"
    return in_repo if in_repo.is_dir() else HERE / "tiny_llama"


#: Meta's params.json of Llama 3.2-1B (its tokenizer gives the 128,256-token vocabulary).
LLAMA32_1B_PARAMS = (
    '{"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "vocab_size": 128256, '
    '"multiple_of": 256, "ffn_dim_multiplier": 1.5, "norm_eps": 1e-05, "rope_theta": 500000.0, '
    '"use_scaled_rope": true}'
)


def llama32_1b_args() -> ModelArgs:
    """Llama 3.2-1B's shape, e.g. to size it on the ``meta`` device without any weights."""
    return ModelArgs(**json.loads(LLAMA32_1B_PARAMS))


def model_memory_mb(model: torch.nn.Module) -> float:
    """Bytes of the model's parameters in MB (2**20): the course's "weights memory".

    Works on a ``meta``-device model too, since it uses only shapes and dtypes.
    """
    return sum(p.numel() * p.element_size() for p in model.parameters()) / MB


def resident_tensor_mb(model: torch.nn.Module) -> float:
    """MB held by every tensor the model's modules hold: parameters, buffers, and plain
    tensor attributes such as an already allocated ``cache_k`` / ``cache_v``."""
    seen: dict[int, int] = {}
    for module in model.modules():
        tensors = [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values()) / MB


@contextmanager
def rss_peak_sampler(interval_s: float = 0.001) -> Iterator[dict[str, int]]:
    """Sample this process's resident set size every ``interval_s`` in a background
    thread; on exit the dict holds ``start`` and ``peak`` RSS in bytes."""
    process = psutil.Process()
    stats = {"start": process.memory_info().rss, "peak": 0}
    stats["peak"] = stats["start"]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            stats["peak"] = max(stats["peak"], process.memory_info().rss)
            done.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        done.set()
        thread.join()
        stats["peak"] = max(stats["peak"], process.memory_info().rss)


def exact_length_prompt(tokenizer: Any, input_len: int, text: str = STORY) -> str:
    """A prompt whose encoding *with BOS* is exactly ``input_len`` tokens.

    Repeats ``text``, keeps a prefix of its tokens and decodes it; since decoding and
    re-encoding a cut can merge differently at the cut, nearby cut points are tried
    until the re-encoded length is right.
    """
    if input_len < 2:
        raise ValueError("input_len must be at least 2 (BOS and one prompt token)")
    # Every repetition adds at least one token, so this is always long enough.
    ids = tokenizer.encode(text * (input_len + 32), bos=False, eos=False)
    want = input_len - 1  # the BOS token is the other one
    for cut in sorted(range(max(1, want - 16), want + 17), key=lambda c: abs(c - want)):
        prompt = tokenizer.decode(ids[:cut])
        if len(tokenizer.encode(prompt, bos=True, eos=False)) == input_len:
            return prompt
    raise ValueError(f"could not build a prompt of exactly {input_len} tokens")


def spread(times: Sequence[float]) -> float:
    """(max - min) / median of repeated timings: 0 for one run."""
    return (max(times) - min(times)) / statistics.median(times) if len(times) > 1 else 0.0


def set_cpu_threads(threads: int | None, device: str | None) -> None:
    """Pin torch's CPU threads (default one); nothing on CUDA, where the GPU does the work."""
    if (device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu":
        torch.set_num_threads(max(1, threads or 1))
        print(f"CPU threads: {torch.get_num_threads()} (--threads to change)")


def _print_record(record: dict[str, Any]) -> None:
    print(f"Batch size: {record['batch_size']}")
    print(f"Input length: {record['input_len']} tokens")
    print(f"Output length: {record['output_len']} tokens")
    print(f"KV caching: {'on' if record['kv_caching'] else 'off'} ({record['device']})")
    times = record.get("inference_times", [record["inference_time"]])
    runs = f" (median of {len(times)} runs, spread {spread(times):.0%})" if len(times) > 1 else ""
    print(f"Inference time: {record['inference_time']:.2f} seconds{runs}")
    print(f"Tokens per second: {record['tokens_per_second']:.2f}")
    print(f"Model weights memory usage: {record['model_memory_mb']:.2f} MB")
    print(f"Peak memory usage: {record['peak_memory_mb']:.2f} MB")
    print("=== Sample Output ===")
    print(record["generation"])


def benchmark_inference(
    batch_size: int,
    input_len: int,
    output_len: int,
    kv_caching: bool,
    *,
    ckpt_dir: str | Path | None = None,
    device: str | None = None,
    model: Any = None,
    tokenizer: Any = None,
    temperature: float = 0.0,
    seed: int = 0,
    warmup: bool = True,
    repeats: int = 1,
) -> dict[str, Any]:
    """Generate ``output_len`` tokens for ``batch_size`` copies of an ``input_len``-token
    prompt (BOS included), print the course record and return it as a dict.

    Without ``model``/``tokenizer`` the checkpoint is built here with max_batch_size =
    batch_size and max_seq_len = input_len + output_len, as in the course, so the
    preallocated cache is sized for this run. Decoding is greedy by default, so both modes
    produce the same text. ``tokens_per_second`` is batch_size * output_len / time.
    ``warmup`` first generates two tokens for a short prompt, so one-time start-up costs
    (kernel and thread-pool initialisation) are not timed. With ``repeats`` > 1 the
    generation is timed that many times (each from the same seed): ``inference_time`` is
    the median and ``inference_times`` lists them all.

    Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` over the call (weights,
    cache and activations). On CPU there is no allocator counter, so it is the memory of
    the tensors the model holds before the call (weights, buffers, any cache already
    allocated) plus the growth of the process's RSS during the call, sampled every 1 ms
    in a background thread; that is comparable to the CUDA figure, but approximate
    (the C allocator may reuse memory it freed earlier without growing the RSS).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if model is None or tokenizer is None:
        ckpt = Path(ckpt_dir) if ckpt_dir is not None else default_ckpt_dir()
        model, tokenizer = Llama.build(
            ckpt_dir=str(ckpt),
            tokenizer_path=str(ckpt / "tokenizer.model"),
            max_seq_len=input_len + output_len,
            max_batch_size=batch_size,
            device=device,
            kv_caching=kv_caching,
        )
    model.eval()
    prompts = [exact_length_prompt(tokenizer, input_len)] * batch_size
    on_cuda = torch.device(device).type == "cuda"
    kwargs = {"top_p": 0.9, "kv_caching": kv_caching, "device": device}
    if warmup:
        model.generate(tokenizer, prompts[:1], max_gen_len=2, temperature=0.0, **kwargs)

    torch.manual_seed(seed)
    if on_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    held_mb = resident_tensor_mb(model)
    times = []
    with rss_peak_sampler() as rss:
        for _ in range(max(1, repeats)):
            torch.manual_seed(seed)
            start = time.perf_counter()
            results = model.generate(
                tokenizer, prompts, max_gen_len=output_len, temperature=temperature, **kwargs
            )
            if on_cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    elapsed = statistics.median(times)
    if on_cuda:
        peak_mb = torch.cuda.max_memory_allocated() / MB
    else:
        peak_mb = held_mb + max(0, rss["peak"] - rss["start"]) / MB

    record = {
        "batch_size": batch_size,
        "input_len": input_len,
        "output_len": output_len,
        "kv_caching": kv_caching,
        "device": device,
        "inference_time": elapsed,
        "inference_times": times,
        "tokens_per_second": batch_size * output_len / elapsed,
        "model_memory_mb": model_memory_mb(model),
        "peak_memory_mb": peak_mb,
        "generation": results[0]["generation"],
    }
    _print_record(record)
    return record


def write_table(records: list[dict[str, Any]], path: Path) -> str:
    """The course reports' table: a row per mode, a column per batch size,
    cells "peak MB / runtime s". Written to ``path`` and returned."""
    sizes = sorted({r["batch_size"] for r in records})
    first = records[0]
    lines = [
        f"Input length = {first['input_len']} tokens, output length = "
        f"{first['output_len']} tokens, device: {first['device']}",
        "",
        "| KV caching | " + " | ".join(f"Batch size = {b}" for b in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for caching, label in ((True, "With KV cache"), (False, "Without KV cache")):
        by_size = {r["batch_size"]: r for r in records if r["kv_caching"] == caching}
        cells = [
            f"{by_size[b]['peak_memory_mb']:.2f} MB / {by_size[b]['inference_time']:.3f} s"
            if b in by_size
            else "-"
            for b in sizes
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", *verdict(records)]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def verdict(records: list[dict[str, Any]]) -> list[str]:
    """Whether the cache won at every batch size, and where the timed runs of the two modes
    overlap (the slowest cached run no faster than the fastest cache-free one): there the
    spread is too large to conclude anything."""
    lines = []
    runs = {
        b: {r["kv_caching"]: r.get("inference_times", [r["inference_time"]]) for r in records
            if r["batch_size"] == b}
        for b in sorted({r["batch_size"] for r in records})
    }  # fmt: skip
    both = {b: t for b, t in runs.items() if len(t) == 2}
    overlap = [b for b, t in both.items() if max(t[True]) >= min(t[False])]
    if overlap:
        lines.append(
            f"WARNING: at batch size {', '.join(map(str, overlap))} the timed runs of the two "
            "modes overlap: too noisy to conclude. Close other programs and run again "
            "(more --repeats)."
        )
    slower = [
        b for b, t in both.items() if not statistics.median(t[True]) < statistics.median(t[False])
    ]
    if slower:
        lines.append(f"The cache was NOT faster at batch size {', '.join(map(str, slower))}.")
    else:
        lines.append("The cache was faster at every batch size.")
    return lines


def write_plot(records: list[dict[str, Any]], path: Path) -> None:
    """Runtime and peak memory against batch size, one line per mode (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(10, 4))
    for caching, label in ((True, "with KV cache"), (False, "without KV cache")):
        rows = sorted(
            (r for r in records if r["kv_caching"] == caching), key=lambda r: r["batch_size"]
        )
        sizes = [r["batch_size"] for r in rows]
        ax_time.plot(sizes, [r["inference_time"] for r in rows], marker="o", label=label)
        ax_mem.plot(sizes, [r["peak_memory_mb"] for r in rows], marker="o", label=label)
    all_sizes = sorted({r["batch_size"] for r in records})
    ax_time.set(xlabel="batch size", ylabel="runtime (s)", title="Generation time")
    ax_mem.set(xlabel="batch size", ylabel="peak memory (MB)", title="Peak memory")
    for ax in (ax_time, ax_mem):
        ax.set_xticks(all_sizes)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep(
    batch_sizes: Sequence[int] = (1, 8, 16),
    input_len: int = 256,
    output_len: int = 32,
    *,
    ckpt_dir: str | Path | None = None,
    device: str | None = None,
    out_dir: str | Path = ".",
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Benchmark both modes at every batch size (a freshly built model per run, so one run's
    cache or activations never count in another's peak) and write
    ``benchmark_results.json``, ``benchmark_table.md`` and ``benchmark_plot.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for caching in (True, False):
        print(f"\n=== {'KV Caching' if caching else 'No KV Caching'} ===")
        for batch_size in batch_sizes:
            where = {"ckpt_dir": ckpt_dir, "device": device}
            records.append(
                benchmark_inference(
                    batch_size, input_len, output_len, caching, repeats=repeats, **where
                )
            )
            print()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    (out / "benchmark_results.json").write_text(json.dumps(records, indent=2) + "\n")
    print(write_table(records, out / "benchmark_table.md"))
    write_plot(records, out / "benchmark_plot.png")
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: a sweep (default) or one ``--single`` run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt-dir", type=Path, default=None)
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--batch-sizes", default="1,8,16", help="comma-separated, for a sweep")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--single", action="store_true", help="one run, no files written")
    parser.add_argument("--batch-size", type=int, default=1, help="with --single")
    parser.add_argument("--kv-caching", choices=["on", "off"], default="on", help="with --single")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting (median)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but no GPU is visible", file=sys.stderr)
        return 2
    set_cpu_threads(args.threads, args.device)
    where = {"ckpt_dir": args.ckpt_dir, "device": args.device}
    if args.single:
        caching = args.kv_caching == "on"
        benchmark_inference(
            args.batch_size, args.input_len, args.output_len, caching, repeats=args.repeats, **where
        )
    else:
        sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
        sweep(
            sizes, args.input_len, args.output_len, out_dir=args.out_dir, repeats=args.repeats,
            **where,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
