# KV cache lab on distilgpt2, written the way the course's lab handout does it, in the
# function signatures of this assignment: the handout's own loops, time.time() around
# each run, the average of the repeats, one untimed warm-up pass before measuring,
# `for k, v in past_key_values` for the cache size and the handout's uint8 cast.
import time

import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel


def load_model(name="distilgpt2", device="cpu"):
    try:
        model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True)
    except OSError:
        model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12))
    model = model.to(device)
    model.eval()
    return model


def model_config_summary(model):
    config = model.config
    return {
        "n_layers": config.n_layer,
        "hidden_size": config.n_embd,
        "n_heads": config.n_head,
        "vocab_size": config.vocab_size,
        "n_positions": config.n_positions,
    }


def generate_no_cache(model, input_ids, L):
    with torch.no_grad():
        for _ in range(L):
            outputs = model(input_ids, use_cache=False)
            next_token = torch.argmax(outputs.logits[:, -1, :], dim=-1)
            input_ids = torch.cat([input_ids, next_token.unsqueeze(-1)], dim=-1)
    return input_ids


def generate_with_cache(model, input_ids, L):
    return generate_with_cache_from(model, input_ids, None, L)


def generate_with_cache_from(model, input_ids, past_key_values, L):
    cached = 0 if past_key_values is None else past_key_values.get_seq_length()
    new_ids = input_ids[:, cached:]
    with torch.no_grad():
        for _ in range(L):
            outputs = model(new_ids, use_cache=True, past_key_values=past_key_values)
            next_token = torch.argmax(outputs.logits[:, -1, :], dim=-1)
            past_key_values = outputs.past_key_values
            new_ids = next_token.unsqueeze(-1)
            input_ids = torch.cat([input_ids, new_ids], dim=-1)
    return input_ids


def measure_latency(model, L_values=(32, 64, 128, 256), prompt_len=8, warmup=1, repeats=3,
                    device="cpu"):
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len)).to(device)
    generate_with_cache(model, prompt, 4)  # warm up once before measuring anything
    results = {"L": [], "no_cache_ms_per_token": [], "cache_ms_per_token": []}
    for L in L_values:
        results["L"].append(L)
        for key, generate in (("no_cache_ms_per_token", generate_no_cache),
                              ("cache_ms_per_token", generate_with_cache)):
            for _ in range(warmup):
                generate(model, prompt, L)
            total = 0.0
            for _ in range(repeats):
                start = time.time()
                generate(model, prompt, L)
                total += time.time() - start
            results[key].append(total / repeats / L * 1000)  # average ms per token
    return results


def theoretical_kv_bytes(L, D, n_layers, bytes_per_elem=2):
    return 2 * L * D * n_layers * bytes_per_elem


def measured_kv_bytes(past_key_values):
    total = 0
    for k, v in past_key_values:
        total += k.numel() * k.element_size() + v.numel() * v.element_size()
    return total


def quantize_kv_int8(past_key_values):
    return tuple(tuple(kv.to(torch.uint8) for kv in layer) for layer in past_key_values)


def dequantize_kv_int8(q):
    return tuple(tuple(kv.to(torch.float32) for kv in layer) for layer in q)


def quantized_kv_bytes(q):
    return sum(kv.numel() * kv.element_size() for layer in q for kv in layer)


if __name__ == "__main__":
    lab_model = load_model()
    print(model_config_summary(lab_model))
    print(measure_latency(lab_model))
