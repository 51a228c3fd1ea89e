"""Part 3: text generation with and without the KV cache.

``Generation`` is mixed into the model class ``Llama``, so ``model.generate``
calls ``self(tokens, start_pos)``. The cached path runs the prompt once
(prefill) and then feeds one token per sequence per step at ``prev_pos``; the
cache-free path feeds the whole prefix from position 0 at every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from llama.tokenizer import Tokenizer


def sample_top_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Sample from the smallest set of tokens whose probabilities sum to at least ``p``.

    probs: (B, vocab) -> (B, 1) token ids.
    """
    # BEGIN SOLUTION
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    cumulative = torch.cumsum(probs_sort, dim=-1)
    # A token is dropped when the tokens ranked above it already reach p.
    probs_sort[(cumulative - probs_sort) > p] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    choice = torch.multinomial(probs_sort, num_samples=1)  # (B, 1) index into the sorted order
    return torch.gather(probs_idx, -1, choice)
    # END SOLUTION
    # BEGIN PROMPT
    # # TODO (top-p sampling):
    # #   1. sort each row's probabilities in descending order (keep the indices);
    # #   2. take the cumulative sum; a token is dropped when the tokens ranked
    # #      above it already reach p (so the token that crosses p is kept);
    # #   3. renormalise what is left and draw one index per row with torch.multinomial;
    # #   4. map the drawn positions back to token ids with torch.gather.
    # raise NotImplementedError("sample_top_p: top-p (nucleus) sampling (see TODO)")
    # END PROMPT


def next_token(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The next token of every sequence from its last logits (B, vocab): greedy at T = 0."""
    if temperature > 0:
        probs = torch.softmax(logits / temperature, dim=-1)
        return sample_top_p(probs, top_p).reshape(-1)
    return torch.argmax(logits, dim=-1)


class Generation:
    """``generate`` for the model class (which provides ``forward``, ``params``)."""

    params: Any

    @torch.inference_mode()
    def generate(
        self,
        tokenizer: Tokenizer,
        prompts: list[str],
        max_gen_len: int,
        temperature: float = 0.6,
        top_p: float = 0.9,
        kv_caching: bool = True,
        device: str | torch.device = "cpu",
    ) -> list[dict[str, Any]]:
        """Continue every prompt by up to ``max_gen_len`` tokens; one dict per prompt with
        its ``"generation"`` (text) and ``"tokens"`` (ids), cut at the first stop token."""
        prompt_tokens = [tokenizer.encode(p, bos=True, eos=False) for p in prompts]
        out = self.generate_tokens(
            prompt_tokens,
            max_gen_len,
            temperature,
            top_p,
            kv_caching,
            device,
            tokenizer.pad_id,
            tokenizer.stop_tokens,
        )
        return [{"generation": tokenizer.decode(t), "tokens": t} for t in out]

    def generate_tokens(
        self,
        prompt_tokens: list[list[int]],
        max_gen_len: int,
        temperature: float,
        top_p: float,
        kv_caching: bool,
        device: str | torch.device,
        pad_id: int,
        stop_tokens: set[int],
    ) -> list[list[int]]:
        """The token-level loop behind :meth:`generate` (ragged prompts allowed)."""
        params = self.params
        bsz = len(prompt_tokens)
        if bsz > params.max_batch_size:
            raise ValueError(f"{bsz} prompts but max_batch_size is {params.max_batch_size}")
        min_prompt_len = min(len(t) for t in prompt_tokens)
        max_prompt_len = max(len(t) for t in prompt_tokens)
        if max_prompt_len > params.max_seq_len:
            raise ValueError(f"a prompt of {max_prompt_len} tokens exceeds max_seq_len")
        total_len = min(params.max_seq_len, max_gen_len + max_prompt_len)
        self.set_kv_caching(kv_caching)

        tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long, device=device)
        for k, t in enumerate(prompt_tokens):
            tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long, device=device)
        is_prompt = tokens != pad_id  # (B, total_len)
        finished = torch.zeros(bsz, dtype=torch.bool, device=device)
        stop = torch.tensor(sorted(stop_tokens), device=device)

        prev_pos = 0
        for cur_pos in range(min_prompt_len, total_len):
            # BEGIN SOLUTION
            if kv_caching:
                logits = self(tokens[:, prev_pos:cur_pos], prev_pos)  # new tokens only
            else:
                logits = self(tokens[:, :cur_pos], 0)  # the whole prefix, every step
            # END SOLUTION
            # BEGIN PROMPT
            # # TODO 4: set `logits` (B, T, vocab) by this step's model call, in place of the
            # #   placeholder below, and delete the raise.
            # #   With the cache (kv_caching): feed only the tokens the cache does not hold
            # #   yet, tokens[:, prev_pos:cur_pos], at start_pos = prev_pos. The first step
            # #   is the prefill (the min_prompt_len tokens all prompts have, at 0); every
            # #   later step is one token per sequence.
            # #   Without the cache: feed the whole prefix tokens[:, :cur_pos] at start_pos 0,
            # #   every step.
            # #   Either way call the model as self(tokens_slice, start_pos).
            # logits = None  # placeholder
            # raise NotImplementedError("generate_tokens: the model call of each step (see TODO)")
            # END PROMPT
            chosen = next_token(logits[:, -1], temperature, top_p)  # (B,)
            # Inside a longer prompt the prompt's own token wins.
            chosen = torch.where(is_prompt[:, cur_pos], tokens[:, cur_pos], chosen)
            tokens[:, cur_pos] = chosen
            finished |= ~is_prompt[:, cur_pos] & torch.isin(chosen, stop)
            # BEGIN SOLUTION
            prev_pos = cur_pos
            # END SOLUTION
            # BEGIN PROMPT
            # # TODO 5: write `prev_pos = cur_pos` here (in both modes), so that the next
            # #   cached step feeds only the token chosen at cur_pos: after this step's call
            # #   the cache holds every position before cur_pos.
            # END PROMPT
            if bool(finished.all()):
                break

        results = []
        for k, t in enumerate(tokens.tolist()):
            start = len(prompt_tokens[k])
            generated = t[start : start + max_gen_len]
            for s in stop_tokens:
                if s in generated:
                    generated = generated[: generated.index(s)]
            results.append(generated)
        return results
