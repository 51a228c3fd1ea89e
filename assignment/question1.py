"""Part 1: KV-cache, batch-size and arithmetic-intensity calculator.

Pure functions over a model spec. Conventions (pinned by the handout so that one
answer is right):

* GiB = 2**30 bytes.
* The parameter count is the real architecture's: token embedding, an untied
  output head, per layer the q/k/v/o projections with GQA shapes, the SwiGLU
  gate/up/down matrices and two RMSNorm weight vectors, plus the final norm.
  No biases.
* The KV cache is stored in the same precision as the weights.
* Under tensor parallelism of degree X, weights and cache are split evenly over
  X GPUs; the batch is counted over the whole group.
* One multiply-add is 2 FLOPs; attention is the "standard" algorithm in which
  S = QK^T, P = softmax(S) and O = PV each go through HBM.

Run ``python question1.py`` to print the answer table and save the two plots.
"""

# Fill in every function marked TODO; keep the names and signatures, the grader
# calls them.

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30  # bytes in one GiB


@dataclass
class ModelSpec:
    n_layers: int  # transformer blocks
    n_q_heads: int  # query heads per layer
    n_kv_heads: int  # key/value heads per layer (GQA: n_kv_heads <= n_q_heads)
    d_model: int  # hidden size; head_dim = d_model // n_q_heads
    d_ff: int  # SwiGLU inner size
    vocab_size: int  # rows of the embedding and of the output head
    bytes_per_param: int = 2  # 2 for fp16/bf16 weights (and KV cache)
    tied_embeddings: bool = False  # True if the output head reuses the embedding

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_q_heads


# The LLaMA-3-8B-like model of the assignment and the hardware it runs on.
LLAMA3_8B = ModelSpec(
    n_layers=32, n_q_heads=32, n_kv_heads=8, d_model=4096, d_ff=14336, vocab_size=128256
)
GPU_MEM_GIB = 80
CONTEXT_LEN = 1024
TP_DEGREE = 2
HEAD_DIM = 128


# ----------------------------------------------------------------------------- memory


def param_count(spec: ModelSpec) -> int:
    """Total number of parameters of a Llama-style decoder (see module docstring)."""
    # TODO: Count embedding, output head (unless tied), per-layer q/k/v/o (GQA shapes),
    # SwiGLU gate/up/down, the two RMSNorm weights per layer, and the final norm.
    raise NotImplementedError("param_count")


def weight_bytes(spec: ModelSpec) -> int:
    """Bytes needed to hold the weights."""
    # TODO: Parameters times bytes per parameter.
    raise NotImplementedError("weight_bytes")


def kv_cache_bytes_per_request(spec: ModelSpec, context_len: int, bytes_per_elem: int = 2) -> int:
    """Bytes of K and V cached for one sequence of ``context_len`` tokens (GQA aware)."""
    # TODO: K and V, for every layer, every KV head, every position.
    raise NotImplementedError("kv_cache_bytes_per_request")


def max_batch_size(spec: ModelSpec, gpu_mem_bytes: int, context_len: int, tp: int = 1) -> int:
    """Largest batch whose KV caches fit next to the weights on ``tp`` GPUs.

    Weights and caches are split evenly over the ``tp`` GPUs, so the group has
    ``tp * gpu_mem_bytes`` to hold one copy of the weights plus ``batch`` caches.
    Returns 0 when the weights alone do not fit.
    """
    # TODO: Free memory of the whole TP group divided by one request's KV cache, floored.
    raise NotImplementedError("max_batch_size")


# ------------------------------------------------------------------ arithmetic intensity


def attention_flops(N: int, d: int, phase: str) -> float:
    """FLOPs of single-head standard attention over a context of N tokens."""
    # TODO: Use the standard-attention algorithm of the handout (2 FLOPs per multiply-add).
    raise NotImplementedError("attention_flops")


def attention_bytes(N: int, d: int, phase: str, bpe: int = 2) -> float:
    """HBM bytes moved by standard attention (S, P and O each written and read back)."""
    # TODO: Count every HBM read and write of Q, K, V, S, P and O, times bpe.
    raise NotImplementedError("attention_bytes")


def arithmetic_intensity(N: int, d: int, phase: str, bpe: int = 2, batch: int = 1) -> float:
    """FLOPs per byte; a batch of independent requests scales both terms alike."""
    # TODO: FLOPs divided by bytes, for a batch of independent requests.
    raise NotImplementedError("arithmetic_intensity")


# ---------------------------------------------------------------------------- answers


def answer_table(
    spec: ModelSpec = LLAMA3_8B,
    gpu_mem_gib: float = GPU_MEM_GIB,
    context_len: int = CONTEXT_LEN,
    tp: int = TP_DEGREE,
    head_dim: int = HEAD_DIM,
) -> dict[str, float]:
    """The assignment's answer table, in the handout's units (GiB, billions)."""
    # TODO: Return a dict with these keys (see the handout's table for the units):
    #   total_params (int), total_params_billion, weight_gib, kv_cache_per_request_gib
    #   (GiB = 2**30 bytes), max_batch_size and max_batch_size_tp (ints, the latter over
    #   `tp` GPUs), ai_prefill and ai_decode (FLOPs/byte at N = context_len, d = head_dim).
    raise NotImplementedError("answer_table")


# ------------------------------------------------------------------------------ plots


def plot_prefill_ai(path: str | Path) -> None:
    """Plot prefill arithmetic intensity against context length N (256..8192), d = 128."""
    # TODO: Plot AI against N = 256..8192 (d = 128, fp16) and save a PNG at `path`.
    raise NotImplementedError("plot_prefill_ai")


def plot_decode_ai(path: str | Path) -> None:
    """Plot decode arithmetic intensity against batch size (1..100), N = 1024, d = 128."""
    # TODO: Plot AI against batch size 1..100 (N = 1024, d = 128) and save a PNG at `path`.
    raise NotImplementedError("plot_decode_ai")


# ------------------------------------------------------------------------------- main


def format_table(table: dict[str, float], tp: int = TP_DEGREE) -> str:
    """The answer table as the handout prints it."""
    rows = [
        (
            "Total model parameters",
            f"{table['total_params']:,} ({table['total_params_billion']:.2f} B)",
        ),
        ("Weight memory", f"{table['weight_gib']:.2f} GiB"),
        ("KV cache per request", f"{table['kv_cache_per_request_gib']:.3f} GiB"),
        ("Max batch size (1 GPU)", f"{table['max_batch_size']}"),
        (f"Max batch size (TP = {tp})", f"{table['max_batch_size_tp']}"),
        ("AI prefill (N=1024, d=128)", f"{table['ai_prefill']:.2f} FLOPs/byte"),
        ("AI decode (N=1024, d=128)", f"{table['ai_decode']:.2f} FLOPs/byte"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    """Print the answer table and write the two plots; a step whose function is still a
    TODO is reported in one line (which function) and the others still run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=".", help="where to save the two plots")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = [
        ("the answer table", lambda: print(format_table(answer_table()))),
        ("prefill_ai.png", lambda: plot_prefill_ai(out / "prefill_ai.png")),
        ("decode_ai.png", lambda: plot_decode_ai(out / "decode_ai.png")),
    ]
    missing = 0
    for what, step in steps:
        try:
            step()
        except NotImplementedError as exc:
            missing += 1
            print(f"{what}: skipped, {exc or 'a function'} is not implemented yet (a TODO).")
        else:
            if what.endswith(".png"):
                print(f"plot written to {out / what}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
