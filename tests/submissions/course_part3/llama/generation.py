from typing import List

import torch


def sample_top_p(probs, p):
    probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    mask = probs_sum - probs_sort > p
    probs_sort[mask] = 0.0
    probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
    next_token = torch.multinomial(probs_sort, num_samples=1)
    return torch.gather(probs_idx, -1, next_token)


class Generation:
    @torch.inference_mode()
    def generate(
        self,
        tokenizer,
        prompts: List[str],
        max_gen_len: int,
        temperature: float = 0.6,
        top_p: float = 0.9,
        kv_caching: bool = True,
        device: str = "cuda",
    ):
        params = self.params
        bsz = len(prompts)
        assert bsz <= params.max_batch_size, (bsz, params.max_batch_size)
        prompt_tokens = [tokenizer.encode(x, bos=True, eos=False) for x in prompts]
        min_prompt_len = min(len(t) for t in prompt_tokens)
        max_prompt_len = max(len(t) for t in prompt_tokens)
        assert max_prompt_len <= params.max_seq_len
        total_len = max_gen_len + max_prompt_len

        pad_id = tokenizer.pad_id
        tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long, device=device)
        for k, t in enumerate(prompt_tokens):
            tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long, device=device)

        prev_pos = 0
        eos_reached = torch.tensor([False] * bsz, device=device)
        input_text_mask = tokens != pad_id
        for cur_pos in range(min_prompt_len, total_len):
            with torch.no_grad():
                if kv_caching:
                    logits = self(tokens[:, prev_pos:cur_pos], prev_pos)
                else:
                    logits = self(tokens[:, :cur_pos], 0)
            if temperature > 0:
                probs = torch.softmax(logits[:, -1] / temperature, dim=-1)
                next_token = sample_top_p(probs, top_p)
            else:
                next_token = torch.argmax(logits[:, -1], dim=-1)
            next_token = next_token.reshape(-1)
            next_token = torch.where(input_text_mask[:, cur_pos], tokens[:, cur_pos], next_token)
            tokens[:, cur_pos] = next_token
            eos_reached |= (~input_text_mask[:, cur_pos]) & (next_token == tokenizer.eos_id)
            prev_pos = cur_pos
            if all(eos_reached):
                break

        out_tokens = []
        for i, toks in enumerate(tokens.tolist()):
            start = len(prompt_tokens[i])
            toks = toks[start : len(prompt_tokens[i]) + max_gen_len]
            if tokenizer.eos_id in toks:
                toks = toks[: toks.index(tokenizer.eos_id)]
            out_tokens.append(toks)
        return [{"generation": tokenizer.decode(t)} for t in out_tokens]
