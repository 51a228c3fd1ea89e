"""Part 2: a tiny decoder-only transformer with a KV cache.

The model is the handout's: single-head attention, a ReLU feed-forward block,
pre-LN decoder layers with residual connections, learned positional
embeddings and a causal mask. With ``use_cache=True`` every attention layer
returns its keys and values, so the next call only processes the new tokens.

Below the model is the harness students run:

    python transformer_skeleton.py --mode evaluate      # logits without the cache
    python transformer_skeleton.py --mode kv_evaluate   # logits with the cache
    python transformer_skeleton.py --mode benchmark     # latency with and without it
"""

# Fill in every TODO; keep the class, attribute and method names and the
# signatures, the autograder calls them and loads a state dict into them.

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F  # F.softmax, F.relu

# One layer's cache: keys and values of every position so far, each (B, T_past, d_model).
LayerCache = tuple[torch.Tensor, torch.Tensor]


def causal_mask(t_new: int, t_total: int, device: torch.device) -> torch.Tensor:
    """True where a query may NOT look.

    The new tokens sit at absolute positions t_past .. t_total - 1, so new token i
    may see keys 0 .. t_past + i and nothing after.
    """
    # TODO:
    #   1. t_past = t_total - t_new (the number of cached positions).
    #   2. Build a (t_new, t_total) boolean tensor on `device` that is True above the
    #      shifted diagonal: row i is True at columns t_past + i + 1 and later.
    #   Hint: torch.triu(torch.ones(..., dtype=torch.bool), diagonal=...). Without a
    #   cache t_past = 0 and this is the usual diagonal=1 mask; with one new token
    #   nothing is masked.
    raise NotImplementedError("causal_mask: build the (t_new, t_total) mask with torch.triu")


class SingleHeadAttention(nn.Module):
    """One attention head of width d_model (so d_k = d_model), with an optional KV cache."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        # TODO: create the four projections, each d_model -> d_model:
        #   self.W_q, self.W_k, self.W_v, self.W_o: nn.Linear(d_model, d_model, bias=False)
        #   (the course's weights have no attention biases, W_o included)

    def forward(
        self, x: torch.Tensor, past_kv: LayerCache | None = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, LayerCache | None]:
        """Attend from the new tokens x (B, T_new, D) to every token so far.

        Returns the output (B, T_new, D) and, when ``use_cache`` is True, the
        layer's full cache (K, V), each (B, T_total, D); otherwise None.
        """
        # TODO:
        #   1. Compute q, k, v = W_q(x), W_k(x), W_v(x), each (B, T_new, D).
        #   2. If use_cache and past_kv is not None: concatenate the cached keys and
        #      values in front of the new ones along dim=1 (the sequence dimension),
        #      so k and v become (B, T_total, D).
        #   3. scores = q @ k^T / sqrt(d_model), shape (B, T_new, T_total).
        #   4. Set the scores where causal_mask(T_new, T_total, x.device) is True to
        #      -inf (hint: masked_fill).
        #   5. weights = softmax over the last dimension; context = weights @ v.
        #   6. Return W_o(context) and (k, v) if use_cache else None.
        raise NotImplementedError("SingleHeadAttention.forward: q/k/v, cache, mask, softmax, W_o")


class FeedForward(nn.Module):
    """Position-wise feed-forward block: Linear -> ReLU -> Linear."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        # TODO: create
        #   self.fc1: nn.Linear(d_model, d_ff)
        #   self.fc2: nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, d_ff) -> (B, T, D)."""
        # TODO: fc2(relu(fc1(x))).
        raise NotImplementedError("FeedForward.forward: fc2(relu(fc1(x)))")


class DecoderLayer(nn.Module):
    """A pre-LN decoder layer: attention and feed-forward, each inside a residual."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        # TODO: create
        #   self.attention: SingleHeadAttention(d_model)
        #   self.feed_forward: FeedForward(d_model, d_ff)
        #   self.norm1, self.norm2: nn.LayerNorm(d_model)
        #   self.dropout: nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, past_kv: LayerCache | None = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, LayerCache | None]:
        """Run x (B, T_new, D) through the layer; return it and the attention's cache."""
        # TODO (pre-LN: normalise the input of each sub-layer, not its output):
        #   1. attended, new_kv = self.attention(norm1(x), past_kv, use_cache)
        #   2. x = x + dropout(attended)
        #   3. x = x + dropout(feed_forward(norm2(x)))
        #   4. Return x and new_kv.
        raise NotImplementedError("DecoderLayer.forward: two pre-LN residual sub-layers")


class DecoderOnlyTransformer(nn.Module):
    """Token + learned position embeddings, a stack of decoder layers, a final norm and head."""

    def __init__(
        self, vocab_size: int, d_model: int, d_ff: int, num_layers: int, max_seq_len: int
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.vocab_size = vocab_size
        self.num_layers = num_layers
        self.max_seq_len = max_seq_len
        # TODO: create
        #   self.token_embedding: nn.Embedding(vocab_size, d_model)
        #   self.pos_embedding: nn.Embedding(max_seq_len, d_model)  (learned positions)
        #   self.layers: nn.ModuleList of num_layers DecoderLayer(d_model, d_ff)
        #   self.norm: nn.LayerNorm(d_model)
        #   self.output_projection: nn.Linear(d_model, vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        past_kv: list[LayerCache] | None = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, list[LayerCache] | None]:
        """Logits for ``input_ids`` (B, T_new), which follow the tokens held in ``past_kv``."""
        # TODO:
        #   1. t_past = number of cached positions (past_kv[0][0].shape[1]) if use_cache
        #      and past_kv, else 0.
        #   2. positions = t_past .. t_past + T_new - 1 (the new tokens continue after
        #      the cached ones); x = token_embedding(input_ids) + pos_embedding(positions).
        #   3. Run x through every layer, giving layer i its own past_kv[i] (or None),
        #      and collect the (K, V) each layer returns into a new list when use_cache.
        #   4. logits = output_projection(norm(x)), shape (B, T_new, vocab).
        #   5. Return logits and the new list of caches (None when use_cache is False).
        raise NotImplementedError("DecoderOnlyTransformer.forward: embed, layers, norm, head")

    # ------------------------------------------------------------------ generation

    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[LayerCache]]:
        """Run the whole prompt once; return the last position's logits and the cache."""
        # TODO: one forward call over input_ids with use_cache=True; return the logits
        # of the last position (B, vocab) and the cache.
        raise NotImplementedError("prefill: one cached forward over the prompt")

    def decode_one_token(
        self, token: torch.Tensor, past_kv: list[LayerCache]
    ) -> tuple[torch.Tensor, list[LayerCache]]:
        """Feed one new token (B, 1) against the cache; return its logits and the longer cache."""
        # TODO: one forward call over token with past_kv and use_cache=True; return the
        # logits (B, vocab) and the updated cache.
        raise NotImplementedError("decode_one_token: one cached forward over the new token")

    @staticmethod
    def sample(logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """Draw one token per row from softmax(logits / temperature): (B, vocab) -> (B, 1)."""
        # TODO: divide by the temperature, softmax over the vocabulary, then
        # torch.multinomial(probs, num_samples=1).
        raise NotImplementedError("sample: softmax(logits / temperature) and torch.multinomial")

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``input_ids`` (B, T) -> (B, T + n).

        With the cache, the prompt is processed once and every later step feeds
        only the newest token; without it, every step re-reads the whole sequence.
        """
        # TODO: repeat max_new_tokens times:
        #   1. Get the logits of the last position (B, vocab):
        #      - use_cache=False: forward over the whole sequence so far;
        #      - use_cache=True, first step: prefill(prompt);
        #      - use_cache=True, later steps: decode_one_token(newest token, cache).
        #   2. next_token = sample(logits, temperature), shape (B, 1).
        #   3. Append it to the sequence along dim=1.
        # Return the prompt followed by the new tokens, (B, T + n) (only the new tokens,
        # (B, n), is accepted too); do not modify input_ids in place.
        raise NotImplementedError("generate: prefill once, then decode one token per step")


# ================= DO NOT MODIFY CODE BELOW THIS LINE =================
# The harness. The autograder does not run it; it runs the same checks itself.

ATOL = 1e-2  # absolute tolerance on every logit, as in the autograder
MIN_SPEEDUP = 3.47  # cache-free / cached time the autograder needs at a 1000-token prompt (CPU)
BENCHMARK_SEED = 0  # the benchmark's own model: random weights, as timing does not depend on them
HERE = Path(__file__).resolve().parent


@dataclass
class ModelConfig:
    vocab_size: int = 1000  # tokens in the vocabulary
    d_model: int = 50  # width of the residual stream
    d_ff: int = 100  # hidden width of the feed-forward block
    num_layers: int = 2  # decoder layers
    max_seq_len: int = 128  # positions the model can embed (the course's weight file has 128)


def find_file(name: str, given: str | None) -> Path:
    """An explicit path, else ``name`` next to this file, else in ../test_cases/public/part2/."""
    if given:
        return Path(given)
    for folder in (HERE, HERE.parent / "test_cases" / "public" / "part2"):
        if (folder / name).is_file():
            return folder / name
    return HERE / name


def load_model(config: ModelConfig, state_dict_path: Path) -> DecoderOnlyTransformer:
    model = DecoderOnlyTransformer(
        config.vocab_size, config.d_model, config.d_ff, config.num_layers, config.max_seq_len
    )
    state = torch.load(state_dict_path, map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(key_mismatch(missing, unexpected))
    print(f"Successfully loaded model state dictionary from {state_dict_path}")
    return model.eval()


def key_mismatch(missing: list[str], unexpected: list[str]) -> str:
    """What is wrong when the course's state dict and the model's parameters differ, in
    a few lines instead of torch's list of every key (a blank skeleton lacks them all)."""

    def some(keys: list[str]) -> str:
        return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")

    lines = ["the state dict's keys do not match the model's parameters."]
    if unexpected:
        lines.append(f"  In the file but not in your model ({len(unexpected)}): {some(unexpected)}")
    if missing:
        lines.append(f"  In your model but not in the file ({len(missing)}): {some(missing)}")
    lines.append(
        "  Create every submodule in the __init__ methods (the TODOs) under the names the "
        "handout gives: W_q, W_k, W_v, W_o, fc1, fc2, norm1, norm2, token_embedding, "
        "pos_embedding, norm, output_projection."
    )
    return "\n".join(lines)


def load_test_cases(path: Path) -> list[dict[str, torch.Tensor]]:
    cases = json.loads(path.read_text())
    print(f"Test cases loaded from {path}")
    return [{key: torch.tensor(value) for key, value in case.items()} for case in cases]


def max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    if got.shape != expected.shape:
        return math.inf
    return (got.float() - expected).abs().max().item()


def sequential_logits(model: DecoderOnlyTransformer, input_ids: torch.Tensor) -> torch.Tensor:
    """Feed the tokens one at a time through the cache; stack the logits (B, T, vocab)."""
    past_kv, steps = None, []
    for t in range(input_ids.shape[1]):
        logits, past_kv = model(input_ids[:, t : t + 1], past_kv=past_kv, use_cache=True)
        steps.append(logits)
    return torch.cat(steps, dim=1)


@torch.no_grad()
def evaluate(model: DecoderOnlyTransformer, cases: list, with_kv: bool) -> bool:
    """Compare the model's logits with the expected ones; print one line per failure."""
    passed = 0
    for i, case in enumerate(cases, start=1):
        ids = case["input_ids"]
        errors = {
            "no cache": max_error(model(ids, use_cache=False)[0], case["expected_logits_no_cache"])
        }
        if with_kv:
            errors["with cache"] = max_error(
                model(ids, use_cache=True)[0], case["expected_logits_with_cache"]
            )
            errors["one token at a time"] = max_error(
                sequential_logits(model, ids), case["expected_logits_sequential"]
            )
        failed = {k: e for k, e in errors.items() if not e <= ATOL}
        passed += not failed
        for kind, err in failed.items():
            print(f"  Test case {i}: {kind}: failed (max error {err:.4g}, tolerance {ATOL})")
    print("Evaluation Results:")
    print(f"  Num test cases: {len(cases)}")
    print(f"  All tests passed: {passed == len(cases)}")
    print(f"  Pass rate: {100 * passed / len(cases):.2f}% ({passed}/{len(cases)})")
    return passed == len(cases)


def time_generate(model, input_ids, new_tokens: int, use_cache: bool, repeats: int) -> float:
    """Median seconds to generate ``new_tokens`` after one warm-up run."""
    model.generate(input_ids, new_tokens, use_cache=use_cache)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.generate(input_ids, new_tokens, use_cache=use_cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def benchmark_model(config: ModelConfig, positions: int) -> DecoderOnlyTransformer:
    """A seeded model of the course's sizes that embeds ``positions`` positions.

    The course's weights embed max_seq_len = 128 positions, too few for the 500-
    and 1000-token prompts. Latency does not depend on the weights, so the
    benchmark times a randomly initialised model with room for its longest run.
    """
    torch.manual_seed(BENCHMARK_SEED)
    model = DecoderOnlyTransformer(
        config.vocab_size, config.d_model, config.d_ff, config.num_layers, positions
    )
    return model.eval()


def benchmark(config: ModelConfig, lengths, new_tokens: int, repeats: int, out_dir: Path):
    """Latency with and without the cache per prompt length; a table, a JSON file and a plot."""
    model = benchmark_model(config, max(config.max_seq_len, max(lengths) + new_tokens))
    rows = []
    print(f"{'prompt':>7} {'no cache (s)':>13} {'cache (s)':>10} {'speedup':>8}")
    for length in lengths:
        ids = torch.randint(0, config.vocab_size, (1, length))
        slow = time_generate(model, ids, new_tokens, use_cache=False, repeats=repeats)
        fast = time_generate(model, ids, new_tokens, use_cache=True, repeats=repeats)
        rows.append(
            {"seq_len": length, "no_cache_s": slow, "cache_s": fast, "speedup": slow / fast}
        )
        print(f"{length:>7} {slow:>13.4f} {fast:>10.4f} {slow / fast:>7.2f}x")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "benchmark_results.json").write_text(json.dumps(rows, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(
        [r["seq_len"] for r in rows],
        [r["no_cache_s"] for r in rows],
        "o-",
        label="without KV cache",
    )
    ax.plot([r["seq_len"] for r in rows], [r["cache_s"] for r in rows], "o-", label="with KV cache")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel(f"seconds to generate {new_tokens} tokens")
    ax.set_title("Generation latency vs. prompt length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "benchmark.png", dpi=120)
    plt.close(fig)
    print(f"Wrote {out_dir / 'benchmark_results.json'} and {out_dir / 'benchmark.png'}")
    longest = max(rows, key=lambda r: r["seq_len"], default=None)
    if longest is not None and longest["seq_len"] >= 1000:
        verdict = "meets" if longest["speedup"] >= MIN_SPEEDUP else "does NOT meet"
        print(
            f"Speedup at {longest['seq_len']} tokens: {longest['speedup']:.2f}x, which {verdict} "
            f"the autograder's CPU threshold of {MIN_SPEEDUP:g}x."
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", choices=["evaluate", "kv_evaluate", "benchmark"], default="evaluate"
    )
    parser.add_argument("--model_state_dict", default=None, help="default: model_state_dict.pt")
    parser.add_argument("--test_cases", default=None, help="default: test_cases.json")
    parser.add_argument("--lengths", default="10,50,100,500,1000", help="benchmark prompt lengths")
    parser.add_argument("--new_tokens", type=int, default=20, help="tokens generated per run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting")
    parser.add_argument("--out_dir", default=str(HERE), help="where the benchmark writes")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    config = ModelConfig()
    weights = find_file("model_state_dict.pt", args.model_state_dict)
    try:
        model = load_model(config, weights)
    except Exception as exc:  # a missing file or a state dict that does not fit the model
        print(f"Error loading model state dictionary from {weights}: {exc}")
        return 1
    if args.mode == "benchmark":
        lengths = [int(n) for n in args.lengths.split(",")]
        benchmark(config, lengths, args.new_tokens, args.repeats, Path(args.out_dir))
        return 0
    cases = load_test_cases(find_file("test_cases.json", args.test_cases))
    return 0 if evaluate(model, cases, with_kv=args.mode == "kv_evaluate") else 1


if __name__ == "__main__":
    sys.exit(main())
