"""Part 3: run Meta's four example prompts through Llama 3, with and without the KV cache.

Both modes should continue each prompt the same way (exactly so with ``--temperature 0``;
with sampling, the same seed gives the same text unless rounding moves a sample), while the
cached mode does far less work per generated token. Usage (from this folder)::

    python inference.py                                # the tiny test checkpoint, both modes
    python inference.py --ckpt-dir ~/.llama/checkpoints/Llama3.2-1B --kv-caching off

The checkpoint folder is in Meta's layout (``params.json``, ``consolidated.00.pth``,
``tokenizer.model``), so real Llama 3.2-1B weights work unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from llama.model import Llama

HERE = Path(__file__).resolve().parent

#: The prompts of Meta's text-completion example, as used throughout the course.
PROMPTS: list[str] = [
    "I believe the meaning of life is",
    "Simply put, the theory of relativity states that ",
    """A brief message congratulating the team on the launch:

        Hi everyone,

        I just """,
    """Translate English to French:

        sea otter => loutre de mer
        peppermint => menthe poivrée
        plush girafe => girafe peluche
        cheese =>""",
]


def default_ckpt_dir() -> Path:
    """The course's tiny test checkpoint: ``../test_cases/public/part3/tiny_llama`` from
    this folder (the repository layout), else ``./tiny_llama`` next to this script (the
    layout handed to students)."""
    in_repo = HERE.parent / "test_cases" / "public" / "part3" / "tiny_llama"
    return in_repo if in_repo.is_dir() else HERE / "tiny_llama"


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_prompts(
    ckpt_dir: str | Path,
    tokenizer_path: str | Path,
    kv_caching: bool,
    *,
    device: str,
    max_gen_len: int = 32,
    temperature: float = 0.6,
    top_p: float = 0.9,
    seed: int | None = None,
    max_seq_len: int = 512,
    prompts: Sequence[str] = PROMPTS,
) -> list[str]:
    """Build the model for one mode, continue every prompt, print and return the texts.

    The model is built per mode because ``kv_caching`` is also a build-time switch (with
    it off no cache is allocated at all).
    """
    model, tokenizer = Llama.build(
        ckpt_dir=str(ckpt_dir),
        tokenizer_path=str(tokenizer_path),
        max_seq_len=max_seq_len,
        max_batch_size=len(prompts),
        device=device,
        kv_caching=kv_caching,
    )
    model.eval()
    if seed is not None:
        torch.manual_seed(seed)
    start = time.perf_counter()
    results = model.generate(
        tokenizer,
        list(prompts),
        max_gen_len=max_gen_len,
        temperature=temperature,
        top_p=top_p,
        kv_caching=kv_caching,
        device=device,
    )
    elapsed = time.perf_counter() - start
    label = "with KV cache" if kv_caching else "without KV cache"
    print(f"\n===== {label} ({elapsed:.2f} s on {device}) =====")
    for prompt, result in zip(prompts, results, strict=True):
        print(prompt)
        print(f"> {result['generation']}")
        print("\n==================================\n")
    return [result["generation"] for result in results]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt-dir", type=Path, default=None, help="Meta-layout checkpoint")
    parser.add_argument(
        "--tokenizer-path", type=Path, default=None, help="default: <ckpt-dir>/tokenizer.model"
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default=default_device())
    parser.add_argument("--max-gen-len", type=int, default=32)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.6, help="0 means greedy")
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--kv-caching", choices=["on", "off", "both"], default="both")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling (same per mode)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the prompts in the requested mode(s); returns a process exit status."""
    args = parse_args(argv)
    ckpt_dir = args.ckpt_dir if args.ckpt_dir is not None else default_ckpt_dir()
    tokenizer_path = args.tokenizer_path or ckpt_dir / "tokenizer.model"
    if not ckpt_dir.is_dir():
        print(f"checkpoint folder {ckpt_dir} not found (use --ckpt-dir)", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but no GPU is visible", file=sys.stderr)
        return 2
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.kv_caching]
    texts = {}
    for kv_caching in modes:
        texts[kv_caching] = run_prompts(
            ckpt_dir,
            tokenizer_path,
            kv_caching,
            device=args.device,
            max_gen_len=args.max_gen_len,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            max_seq_len=args.max_seq_len,
        )
    if len(texts) < 2:
        return 0
    verdict, agree = compare_modes(texts[True], texts[False], greedy=args.temperature == 0)
    print(verdict)
    return 0 if agree or args.temperature != 0 else 1


def compare_modes(cached: list[str], free: list[str], *, greedy: bool) -> tuple[str, bool]:
    """Whether the two modes continued every prompt the same way, said in a sentence.

    Greedy texts must be identical (a difference means the two paths compute different
    logits); sampled ones, drawn with the same seed, normally are, but a rounding
    difference can move one sample and everything after it.
    """
    differ = [i + 1 for i, (a, b) in enumerate(zip(cached, free, strict=True)) if a != b]
    if not differ:
        return f"AGREE: both modes gave the same text for all {len(cached)} prompts.", True
    which = ", ".join(map(str, differ))
    if greedy:
        return (
            f"DIFFER: with --temperature 0 both modes must give the same text, but prompt(s) "
            f"{which} differ: the cached and the cache-free paths compute different logits.",
            False,
        )
    return (
        f"DIFFER on prompt(s) {which}. Sampling can diverge after one rounding difference; "
        "run with --temperature 0, where the two modes must agree exactly.",
        False,
    )


if __name__ == "__main__":
    sys.exit(main())
