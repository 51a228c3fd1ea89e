# Problem 1: KV cache, batch size and arithmetic intensity for a LLaMA-3-8B-like model.
# A plain script in the course's style: it prints its answers, it defines no functions
# for anyone to call.
import math

L, Q, K = 32, 32, 8  # layers, query heads, KV heads
h1, h2, V = 4096, 14336, 128256  # hidden size, FFN inner size, vocabulary
p = 2  # bytes per parameter and per cached element (fp16)
s = 1024  # context length
gpu = 80 * 1024**3  # one GPU's memory in bytes (80 GiB)
X = 2  # tensor parallel degree
head = h1 // Q

attn = h1 * h1 + 2 * h1 * (K * head) + h1 * h1  # W_q, W_k, W_v, W_o (GQA shapes)
ffn = 3 * h1 * h2  # SwiGLU gate, up, down
norms = 2 * h1  # two RMSNorm weights per layer
params = 2 * V * h1 + L * (attn + ffn + norms) + h1  # embedding, head, layers, final norm
weights = params * p
kv = 2 * L * K * head * s * p  # K and V, every layer, every KV head, every position
batch = (gpu - weights) // kv
batch_tp = (X * gpu - weights) // kv

print("----- Question 1(a) Results -----")
print(f"Total model parameters: {params / 1e9:.2f} Billion")
print(f"Memory in bytes: {weights}")
print(f"Total parameter memory: {weights / 1024**3:.2f} GiB")
print(f"KV cache per request: {kv / 1024**3:.3f} GiB")
print(f"Max batch size possible: {batch}")
print("----- Question 1(b) Results -----")
print(f"For Tensor Parallelism (TP) dimension X = {X}:")
print(f"Max batch size possible: {batch_tp}")


def intensity(N, d, prefill, B=1):
    flops = 4 * N * N * d if prefill else 4 * N * d
    moved = (4 * N * N + 4 * N * d) if prefill else (2 * d + 2 * N * d + 4 * N)
    return B * flops / (B * moved * p)


print("----- Question 1(d) Arithmetic Intensity -----")
print(f"Arithmetic Intensity (Prefill) for N=1024, d=128: {intensity(1024, 128, True):.2f} FLOPs/byte")
print(f"Arithmetic Intensity (Decode) for N=1024, d=128: {intensity(1024, 128, False):.2f} FLOPs/byte")
for B in (8, 64):
    ai = intensity(1024, 128, False, B)
    print(f"Arithmetic Intensity (Decode) for N=1024, d=128, batch {B}: {ai:.2f} FLOPs/byte")
print(f"Prefill limit d / BPE: {math.floor(128 / p)}")
