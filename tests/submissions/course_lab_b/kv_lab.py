# KV cache lab on distilgpt2, a second way students write it: the prefill outside the
# loop (it always appends one token), time.perf_counter() and the median, but one timed
# run per L whatever warmup and repeats say; the cache read through DynamicCache.layers
# (the transformers 5 API); the bonus left out.
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def load_model(name="distilgpt2", device="cpu"):
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=6)).to(device).eval()


def model_config_summary(model):
    c = model.config
    return {"n_layers": c.n_layer, "hidden_size": c.n_embd, "n_heads": c.n_head,
            "vocab_size": c.vocab_size, "n_positions": c.n_positions}


@torch.no_grad()
def generate_no_cache(model, input_ids, L):
    ids = input_ids
    for _ in range(L):
        logits = model(ids, use_cache=False).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@torch.no_grad()
def generate_with_cache(model, input_ids, L):
    out = model(input_ids, use_cache=True)  # prefill
    ids = torch.cat([input_ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    cache = out.past_key_values
    for _ in range(L - 1):
        out = model(ids[:, -1:], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        ids = torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@torch.no_grad()
def generate_with_cache_from(model, input_ids, past_key_values, L):
    ids, cache = input_ids, past_key_values
    new = input_ids[:, cache.get_seq_length():]
    for _ in range(L):
        out = model(new, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        new = out.logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, new], dim=1)
    return ids


def measure_latency(model, L_values=(32, 64, 128, 256), prompt_len=8, warmup=1, repeats=3,
                    device="cpu"):
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), device=device)
    out = {"L": list(L_values), "no_cache_ms_per_token": [], "cache_ms_per_token": []}
    for L in L_values:
        for key, fn in (("no_cache_ms_per_token", generate_no_cache),
                        ("cache_ms_per_token", generate_with_cache)):
            times = []
            start = time.perf_counter()
            fn(model, prompt, L)
            times.append(time.perf_counter() - start)
            out[key].append(statistics.median(times) * 1000 / L)
    return out


def theoretical_kv_bytes(L, D, n_layers, bytes_per_elem=2):
    return 2 * L * D * n_layers * bytes_per_elem


def measured_kv_bytes(past_key_values):
    return sum(t.numel() * t.element_size()
               for layer in past_key_values.layers for t in (layer.keys, layer.values))


def quantize_kv_int8(past_key_values):
    raise NotImplementedError("bonus not attempted")


def dequantize_kv_int8(q):
    raise NotImplementedError("bonus not attempted")


def quantized_kv_bytes(q):
    raise NotImplementedError("bonus not attempted")
