"""Part 3 adapter: drives the student's Llama (``llama/model.py``, ``llama/generation.py``).

As in Part 2, every function takes the student's (or, in ``regen``, the
reference's or a mutant's) modules explicitly, so expected values, the
diagnosis catalogue and the grading observations come from the same code.
Models are built once per (name, kv_caching) and kept between requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

if __package__:  # grader.parts.part3.adapter: regen and the tests, in the grader's process
    from grader.parts.part3.adapter_cache import (
        cache_dtypes,
        cache_shapes,
        held_arrays,
        written_by,
    )
    from grader.parts.part3.adapter_isolate import FedTokens, decode, encode, run_stages
    from grader.parts.part3.adapter_load import (
        NOTES,
        _device,
        build_from_arrays,
        build_from_checkpoint,
        build_notes,
    )
    from grader.parts.part3.adapter_weights import draw_on
else:  # adapter_part3.py, flat among the worker's scripts in the sandbox
    from adapter_part3_cache import (
        cache_dtypes,
        cache_shapes,
        held_arrays,
        written_by,
    )
    from adapter_part3_isolate import FedTokens, decode, encode, run_stages
    from adapter_part3_load import (
        NOTES,
        _device,
        build_from_arrays,
        build_from_checkpoint,
        build_notes,
    )
    from adapter_part3_weights import draw_on

PACKAGE: dict[str, Any] = {}  # "model", "generation": the student's modules
MODELS: dict[str, Any] = {}
TOKENIZERS: dict[str, Any] = {}


def setup() -> None:
    import torch  # noqa: F401  (imported before the student's code)

    redirect_cuda()
    from llama import generation, model

    PACKAGE.update(model=model, generation=generation)
    try:  # the course's code ships its own tokenizer; only a course-style build needs it
        from llama import tokenizer
    except ImportError:
        return
    PACKAGE["tokenizer"] = tokenizer


def redirect_cuda() -> None:
    """Without a GPU, ``Tensor.cuda()`` and ``Module.cuda()`` move to the grading device
    instead of failing: the course's ``Attention.__init__`` allocates its cache with
    ``.cuda()``, which is right on the course's machines and not the part being graded."""
    import torch

    if torch.cuda.is_available():
        return

    def to_grading_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        NOTES["cuda_calls"] += 1
        return self.to(_device())  # Tensor.to and Module.to alike

    torch.Tensor.cuda = to_grading_device
    torch.nn.Module.cuda = to_grading_device


def _numpy(logits: Any) -> np.ndarray:
    import torch

    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"forward must return a tensor of logits, got {type(logits).__name__}")
    return logits.detach().to("cpu", torch.float32).numpy()


def run_forward(model: Any, tokens: np.ndarray, steps: list[list[int]]) -> np.ndarray:
    """Logits of successive ``model(tokens[:, s : s + n], s)`` calls, joined on the
    sequence axis: (B, sum n, vocab). One call (0, T) is the cache-free case."""
    import torch

    ids = torch.as_tensor(tokens, dtype=torch.long, device=_device())
    pieces = []
    with torch.inference_mode():
        for start, n in steps:
            pieces.append(_numpy(model(ids[:, start : start + n], start)))
    try:
        return np.concatenate(pieces, axis=1)
    except ValueError:
        shapes = [p.shape for p in pieces]
        raise TypeError(f"successive forward calls returned logits of shapes {shapes}") from None


def run_generate(
    model: Any, tokenizer: Any, prompts: list[str], settings: dict[str, Any]
) -> dict[str, Any]:
    """Seeded ``generate``, recording every forward call's (start_pos, length) and the
    logits of its last position (the call record is a hint for feedback: the submission
    can rewrite it). ``settings["device"]``: "cpu" for a model built there (check 3.7's
    work probe), else the grading device. With ``settings["record_tokens"]``, what every
    call fed the model, by row and position, too (``fed_tokens``: the isolating
    experiments' evidence)."""
    import torch

    calls: list[list[int]] = []
    fed = FedTokens() if settings.get("record_tokens") else None
    first_ids: list[int] = []
    last_logits: list[np.ndarray] = []
    record = settings.get("record_logits", True)
    original = model.forward

    def recording_forward(tokens: Any, start_pos: Any, *args: Any, **kwargs: Any) -> Any:
        if fed is not None:  # before the call: what the model was given
            fed.add(tokens, start_pos)
        out = original(tokens, start_pos, *args, **kwargs)
        if not calls and int(start_pos) == 0 and tokens.shape[1]:
            first_ids.extend(int(t) for t in tokens[:, 0].tolist())  # BOS, if encoded
        calls.append([int(start_pos), int(tokens.shape[1])])
        if record and isinstance(out, torch.Tensor) and out.ndim == 3:
            # A copy: a view would keep every step's whole (B, T, vocab) logits alive.
            last_logits.append(out[:, -1].detach().to("cpu", torch.float32).numpy().copy())
        return out

    model.forward = recording_forward
    try:
        torch.manual_seed(settings["seed"])
        results = call_generate(model, tokenizer, prompts, settings)
    finally:
        del model.forward
    texts = []
    for item in results:
        if not isinstance(item, dict) or not isinstance(item.get("generation"), str):
            raise TypeError('generate must return one dict per prompt with a "generation" string')
        texts.append(item["generation"])
    same_shape = last_logits and all(x.shape == last_logits[0].shape for x in last_logits)
    steps = np.stack(last_logits) if same_shape else np.zeros((0,), np.float32)
    out = {"texts": texts, "calls": calls, "first_ids": first_ids, "step_logits": steps}
    if fed is not None:
        out |= fed.arrays() | {"changed": fed.changed}
    return out


def call_generate(model: Any, tokenizer: Any, prompts: list[str], settings: dict[str, Any]) -> Any:
    """The student's generation: the kit's and the course's ``model.generate(tokenizer,
    prompts, ..., kv_caching, device)``, or, where the model class has no ``generate``
    (Meta's layout: a ``Transformer`` and a ``Llama(model, tokenizer)`` wrapper in
    generation.py), the wrapper's ``text_completion``, its mode fixed at build."""
    import inspect

    run = {
        "max_gen_len": settings["max_gen_len"],
        "temperature": settings["temperature"],
        "top_p": settings["top_p"],
    }
    if callable(getattr(model, "generate", None)):
        device = settings.get("device") or _device()
        return model.generate(
            tokenizer, prompts, **run, kv_caching=settings["kv_caching"], device=device
        )
    wrapper = getattr(PACKAGE.get("generation"), "Llama", None)
    if not callable(getattr(wrapper, "text_completion", None)):
        raise TypeError(
            "your model has no generate(tokenizer, prompts, ...) and llama/generation.py no "
            "Llama(model, tokenizer) with text_completion(prompts, ...)"
        )
    if "kv_caching" in inspect.signature(wrapper.text_completion).parameters:
        run["kv_caching"] = settings["kv_caching"]
    return wrapper(model, tokenizer).text_completion(prompts, **run)


def run_sample_top_p(pkg: dict[str, Any], probs: np.ndarray, p: float, draws: int) -> np.ndarray:
    """``draws`` seeded samples from ``sample_top_p`` for every row of ``probs``: (B, draws)."""
    import torch

    torch.manual_seed(0)
    fn = pkg["generation"].sample_top_p
    batch = torch.as_tensor(probs, dtype=torch.float32)
    out = [fn(batch.clone(), p).reshape(-1) for _ in range(draws)]
    return torch.stack(out, dim=1).to(torch.int64).numpy()


def cache_read_effect(
    model: Any,
    tokens: np.ndarray,
    prefix: int,
    heads: tuple[int, ...] = (),
    head_dim: int | None = None,
    steps: int = 1,
    per_owner: bool = False,
) -> float | dict[str | None, float] | None:
    """The largest change of the logits ``steps`` single-token steps after a prefill of
    ``prefix`` tokens when every tensor that may hold the cache and that the prefill wrote
    (:func:`written_by`) is overwritten with noise, in place, right after that prefill:
    far from zero for an attention that reads its cache at every step (the prompt's
    scrambled entries stay in it), zero for one that recomputes what it attends over, at
    once or at any step before the last (a cache refreshed every few steps). Found after
    the prefill, wherever the model can reach it (on a layer, in a closure, in a helper
    module's globals), the cache is the one the next step reads, however it was allocated
    or rebound; a table the prefill did not write and the weights are never scrambled.
    The unscrambled steps follow the same prefill again. Infinite where only the
    scrambled run is NaN; None where no cache tensor is found or one cannot be written
    (the other probes judge). ``per_owner``: the same figure (under None) and one for each
    owner's cache tensors scrambled alone, by the module's name (an attention layer that
    projects its keys and values again, while the others read theirs, shows no change of
    its own)."""
    import torch

    ids = torch.as_tensor(tokens, dtype=torch.long, device=_device())
    later = ids[:, prefix : prefix + steps]
    other = torch.where(ids[:, :prefix] > 0, ids[:, :prefix] - 1, ids[:, :prefix] + 1)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def decode() -> np.ndarray:
        out = None
        for j in range(later.shape[1]):
            out = model(later[:, j : j + 1], prefix + j)
        return _numpy(out)

    written: list[str] = []  # the owners whose cache tensors the prefill wrote

    def scrambled(owner: str | None) -> np.ndarray | None:
        """The steps after a prefill whose cache tensors (of ``owner`` alone, or all) were
        overwritten with noise; None where there are none or one cannot be written. What
        the prefill wrote is what a prefill of other tokens just before left otherwise: a
        buffer left unused (Meta's cache_k kept beside a cache of the student's own
        elsewhere) or a fixed table is not among it."""
        model(other, 0)
        by_owner = written_by(model, lambda: model(ids[:, :prefix], 0), prefix, heads, head_dim)
        if owner is None:
            written[:] = list(by_owner)
        found = [t for name, ts in by_owner.items() if owner in (None, name) for t in ts]
        try:
            for t in found:
                t.copy_((torch.randn(t.shape, generator=gen) * 3).to(t.device, t.dtype))
        except RuntimeError:  # an expanded view, say: not writable in place
            return None
        return decode() if found else None

    with torch.inference_mode():
        runs = {None: scrambled(None)}
        if runs[None] is None:
            return None
        if per_owner and len(written) > 1:  # one owner: the figure of all at once
            runs |= {owner: scrambled(owner) for owner in list(written)}
        model(ids[:, :prefix], 0)
        plain = decode()
    effects = {owner: change_of(plain, got) for owner, got in runs.items() if got is not None}
    return effects if per_owner else effects[None]


def change_of(plain: np.ndarray, scrambled: np.ndarray) -> float:
    """The largest change of the logits with the cache scrambled: infinite where only the
    scrambled run is NaN."""
    change = np.abs(plain.astype(np.float64) - scrambled)
    change[np.isnan(scrambled) & ~np.isnan(plain)] = np.inf
    return float(change.max())


def cache_contents(
    model: Any, tokens: np.ndarray, prefix: int, heads: tuple[int, ...], head_dim: int
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """What the model holds after a prefill of ``prefix`` tokens and one decode step at
    start_pos = prefix, called as generate calls forward: the first prefix + 1 positions of
    every tensor that may be its cache (:func:`held_arrays`), wherever it was allocated or
    rebound, their dtypes, and the step's logits (``logits``, (B, vocab)). The grader
    compares them with the reference's keys and values of every layer."""
    import torch

    ids = torch.as_tensor(tokens, dtype=torch.long, device=_device())
    with torch.inference_mode():
        model(ids[:, :prefix], 0)
        logits = _numpy(model(ids[:, prefix : prefix + 1], prefix))
        arrays, dtypes = held_arrays(model, prefix + 1, heads, head_dim)
    last = logits[:, -1] if logits.ndim == 3 else logits
    return {"dtypes": dtypes}, {**arrays, "logits": last}


def release_freed_memory() -> None:
    """Collect garbage and hand the C heap's free pages back to the kernel (glibc), so the
    worker's resident memory, which the grader reads from outside, shows what is still held
    (check 3.1's memory probe). Elsewhere freed large blocks go back on their own."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None).malloc_trim(0)


# ----------------------------------------------------------------- the protocol


def plain_words(tokenizer: Any, n_ranks: int) -> list[str]:
    """Token texts among the first ``n_ranks`` that are a space and lower-case letters:
    prompts joined from them encode to one token per word."""
    out = []
    for i in range(n_ranks):
        text = tokenizer.decode([i])
        word = text[1:]
        if text.startswith(" ") and len(word) > 1 and word.isascii() and word.isalpha():
            out += [text] if word.islower() else []
    return out


def plain_prompts(tokenizer: Any, n_ranks: int, count: int, length: int, seed: int) -> list[str]:
    """``count`` random texts of plain words that encode to exactly ``length`` tokens (BOS
    included), drawn from ``seed``."""
    words = plain_words(tokenizer, n_ranks)
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    while len(texts) < count:
        text = "".join(rng.choice(words, length - 1))
        if len(tokenizer.encode(text, bos=True, eos=False)) == length:
            texts.append(text)
    return texts


def _key(request: dict[str, Any]) -> str:
    """The model a request uses: its name and the ``kv_caching`` it was built with
    (``built_with``, when a generate call asks for the other mode)."""
    built = request.get("built_with", request["kv_caching"])
    return f"{request['model']}:{'cache' if built else 'nocache'}"


def handle(request: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    op = request.get("op")
    if op == "build":
        MODELS[_key(request)], TOKENIZERS[request["model"]] = build_from_checkpoint(
            PACKAGE, request
        )
        return build_notes(MODELS[_key(request)]), {}
    if op == "load":
        weights: dict[str, Any] = arrays
        if request.get("on_device"):  # a GPU workload's model: drawn here, not sent
            seed, vocab = int(request["seed"]), int(request["vocab_size"])
            weights = draw_on(request["params"], vocab, seed, _device())
        MODELS[_key(request)] = build_from_arrays(PACKAGE, request, weights)
        return build_notes(MODELS[_key(request)]), {}
    if op == "build_error":  # Llama.build on a broken checkpoint: what does it raise?
        try:
            build_from_checkpoint(PACKAGE, request)
        except Exception as exc:
            return {"raised": type(exc).__name__, "message": str(exc)[:1000]}, {}
        return {"raised": None}, {}
    if op == "forward":
        logits = run_forward(MODELS[_key(request)], arrays["tokens"], request["steps"])
        return {}, {"logits": logits}
    if op == "generate":
        model = MODELS[_key(request)]
        out = run_generate(model, TOKENIZERS[request["tokenizer"]], request["prompts"], request)
        header = {"texts": out["texts"], "calls": out["calls"], "first_ids": out["first_ids"]}
        arrays = {"step_logits": out["step_logits"]}
        if "fed_tokens" in out:
            header["changed"] = out["changed"]
            arrays["fed_tokens"] = out["fed_tokens"]
        return header, arrays
    if op == "stages":  # every stage's output of a forward plan (the isolating experiments)
        model = MODELS[_key(request)]
        return {}, run_stages(model, arrays["tokens"], request["steps"], _device())
    if op == "encode":  # the prompts' ids, as generate encodes them
        return {"ids": encode(TOKENIZERS[request["tokenizer"]], request["prompts"])}, {}
    if op == "decode":  # the texts of the grader's candidate continuations
        return {"texts": decode(TOKENIZERS[request["tokenizer"]], request["rows"])}, {}
    if op == "cache_read":  # does attention read its cache? (see cache_read_effect)
        heads = tuple(int(h) for h in request.get("heads", ()))
        effects = cache_read_effect(
            MODELS[_key(request)],
            arrays["tokens"],
            request["prefix"],
            heads,
            request.get("head_dim"),
            int(request.get("steps", 1)),
            per_owner=True,
        )
        if effects is None:
            return {"effect": None}, {}
        layers = {name: e for name, e in effects.items() if name is not None}
        return {"effect": effects[None], "layer_effects": layers}, {}
    if op == "cache_contents":  # what may hold the cache after a prefill and a step
        heads = tuple(int(h) for h in request.get("heads", ()))
        model = MODELS[_key(request)]
        return cache_contents(
            model, arrays["tokens"], int(request["prefix"]), heads, int(request["head_dim"])
        )
    if op == "cache_shapes":  # what cache_k / cache_v every attention layer holds now
        model = MODELS[_key(request)]
        return {"shapes": cache_shapes(model), "dtypes": cache_dtypes(model)}, {}
    if op == "settle":  # before the grader reads the worker's resident memory
        release_freed_memory()
        return {}, {}
    if op == "plain_prompts":  # asked of the reference only: a GPU workload's prompts
        tokenizer = TOKENIZERS[request["tokenizer"]]
        texts = plain_prompts(
            tokenizer, request["n_ranks"], request["count"], request["input_len"], request["seed"]
        )
        return {"prompts": texts}, {}
    if op == "sample_top_p":
        draws = run_sample_top_p(PACKAGE, arrays["probs"], request["p"], request["draws"])
        return {}, {"draws": draws}
    raise ValueError(f"unknown request {op!r}")
