"""Part 3: Meta's Llama 3 reference code with a switchable KV cache."""
