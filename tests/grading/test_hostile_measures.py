"""Hostile submissions against what the grader measures: forged records, memos, dummy answers.

A submission can rewrite anything its own process records about it (the
adapter's forward-call counts and cache shapes, its CUDA peak memory) and keep
state between requests. Each test here is a submission in disguise that used
one of those to earn points; the points now rest on the work the grader
measures (CPU time read from the kernel) and on answers checked against the
reference's: timed runs on prompts the submission has never seen, and logits
of a batch that fills the whole cache.
"""

from __future__ import annotations

from pathlib import Path

from grader.sandbox.sandbox import Limits
from tests.conftest import ATTACK, PART2_LIMITS, patched_solution, run_grade

PART3_LIMITS = Limits(request_timeout_s=30.0, startup_timeout_s=30.0)

# Part 2: generate(use_cache=True) recomputes the whole sequence at every step.
RECOMPUTES = ("if not use_cache:", "if True:")
PART2_LOOP = "        tokens = input_ids\n        past_kv: list[LayerCache] | None = None\n"
# Part 3: prev_pos never advances, so every cached step feeds the whole prefix from 0.
PREV_POS_STUCK = ("            prev_pos = cur_pos\n", "            pass  # prev_pos stays 0\n")


def grade_part2(tmp_path: Path, edits: list[tuple[str, str]], prelude: str = ""):
    """Grade Part 2 of the solution with ``edits``, ``prelude`` run at import."""
    anchor = "# One layer's cache"
    if prelude:
        edits = [*edits, (anchor, prelude + anchor)]
    submission = patched_solution(tmp_path / "part2", "transformer_skeleton.py", edits)
    return run_grade(submission, tmp_path / "out2", parts=["part2"], limits=PART2_LIMITS)


def grade_part3(tmp_path: Path, edits: list[tuple[str, str]], **kwargs):
    submission = patched_solution(tmp_path / "part3", "llama/generation.py", edits)
    return run_grade(submission, tmp_path / "out3", parts=["part3"], limits=PART3_LIMITS, **kwargs)


# ------------------------------------------------------------ forged records


FORGE_PART2_LENGTHS = """import sys as _sys

_adapter = _sys.modules.get("adapter_part2")
if _adapter is not None:  # inside the grader's worker: rewrite what it records
    _real_run_generate = _adapter.run_generate

    def _forged_run_generate(model, input_ids, max_new_tokens, *args):
        out = _real_run_generate(model, input_ids, max_new_tokens, *args)
        if args[1]:  # use_cache: report a prefill, then one token per call
            out["forward_lengths"] = [input_ids.shape[1]] + [1] * (max_new_tokens - 1)
        return out

    _adapter.run_generate = _forged_run_generate

"""


def test_forged_forward_counts_do_not_earn_check_2_9(tmp_path: Path) -> None:
    graded = grade_part2(tmp_path, [RECOMPUTES], FORGE_PART2_LENGTHS)
    assert graded.score("2.9") == 0
    message = graded.output("2.9")
    assert "did not do less work than generate(use_cache=False)" in message
    assert "CPU time" in message
    assert graded.score("2.8") == graded.test("2.8")["max_score"]  # its outputs are right


FORGE_PART3_CALLS = """import sys as _sys

_adapter = _sys.modules.get("adapter_part3")
if _adapter is not None:  # inside the grader's worker: rewrite what it records
    _real_run_generate = _adapter.run_generate

    def _forged_run_generate(model, tokenizer, prompts, settings):
        out = _real_run_generate(model, tokenizer, prompts, settings)
        calls = out["calls"]
        if settings["kv_caching"] and calls:  # a prefill, then one token per step
            start = calls[0][0] + calls[0][1]
            out["calls"] = [calls[0]] + [[start + i, 1] for i in range(len(calls) - 1)]
        return out

    _adapter.run_generate = _forged_run_generate


"""


def test_forged_call_records_do_not_earn_check_3_7(tmp_path: Path) -> None:
    forge = ("def sample_top_p(", FORGE_PART3_CALLS + "def sample_top_p(")
    graded = grade_part3(tmp_path, [PREV_POS_STUCK, forge], skip_tags=frozenset({"benchmark"}))
    assert graded.score("3.7") == 0
    message = graded.output("3.7")
    assert "did not do much less work than generate(kv_caching=False)" in message
    assert graded.score("3.5") == graded.test("3.5")["max_score"]  # its text is right


# ------------------------------------------------------- memos, dummy answers


def test_a_memo_of_earlier_requests_does_not_pass_check_2_11(tmp_path: Path) -> None:
    # Cache-free, but a cached call whose prompt was seen before returns the old answer:
    # with one prompt for every timed run, the cached runs were all memo hits.
    memo = (
        "        key = input_ids.cpu().numpy().tobytes()\n"
        "        if use_cache and key in _MEMO:\n"
        "            return _MEMO[key].clone()\n" + PART2_LOOP
    )
    store = (
        "        return tokens\n",
        "        _MEMO[key] = tokens.clone()\n        return tokens\n",
    )
    graded = grade_part2(tmp_path, [RECOMPUTES, (PART2_LOOP, memo), store], "_MEMO = {}\n")
    assert graded.score("2.11") == 0
    assert "NOT MET" in graded.output("2.11")


def test_dummy_tokens_for_long_prompts_do_not_pass_check_2_11(tmp_path: Path) -> None:
    # Cache-free, and a cached call with a benchmark-long prompt returns random tokens.
    dummy = (
        "        if use_cache and input_ids.shape[1] >= 500:\n"
        "            new = torch.randint(0, 1000, (input_ids.shape[0], max_new_tokens))\n"
        "            return torch.cat([input_ids, new.to(input_ids.device)], dim=1)\n" + PART2_LOOP
    )
    graded = grade_part2(tmp_path, [RECOMPUTES, (PART2_LOOP, dummy)])
    assert graded.score("2.11") == 0
    assert "returned other tokens than the reference" in graded.output("2.11")


MEMO_PART3 = """    def generate(
        self, tokenizer, prompts, max_gen_len, temperature=0.6, top_p=0.9,
        kv_caching=True, device="cpu",
    ):
        if kv_caching and all((p, max_gen_len) in _MEMO for p in prompts):
            return [dict(_MEMO[p, max_gen_len]) for p in prompts]
        out = self.generate_unmemoised(
            tokenizer, prompts, max_gen_len, temperature, top_p, kv_caching, device
        )
        for p, o in zip(prompts, out):
            _MEMO[p, max_gen_len] = o
        return out

    def generate_unmemoised(
"""


@ATTACK
def test_a_memo_of_earlier_requests_does_not_pass_check_3_11(tmp_path: Path) -> None:
    # Cache-free in disguise, and a cached call whose prompts were all seen before
    # returns the old texts: with one prompt in every row of every timed run, each
    # cached run was a memo hit of the cache-free run just before it.
    edits = [
        PREV_POS_STUCK,
        ("class Generation:", "_MEMO = {}\n\n\nclass Generation:"),
        ("    def generate(\n", MEMO_PART3),
    ]
    graded = grade_part3(tmp_path, edits, tags=frozenset({"benchmark"}))
    assert graded.score("3.11") == 0
    assert "NOT MET" in graded.output("3.11")


# ------------------------------------------------------------ forged cache shapes

# Part 3: a cache of half max_seq_len positions, which short prompts never outgrow.
HALF_CACHE = (
    "return (self.max_batch_size, self.max_seq_len, self.n_kv_heads, self.head_dim)",
    "return (self.max_batch_size, self.max_seq_len // 2, self.n_kv_heads, self.head_dim)",
)
FORGE_PART3_SHAPES = """import sys as _sys

_adapter = _sys.modules.get("adapter_part3")
if _adapter is not None:  # inside the grader's worker: report Meta's cache shape
    def _forged_cache_shapes(model):
        a = model.params
        want = [a.max_batch_size, a.max_seq_len, a.n_kv_heads, a.dim // a.n_heads]
        return [[want, want] if a.kv_caching else [None, None] for _ in model.layers]

    _adapter.cache_shapes = _forged_cache_shapes


"""


def test_forged_cache_shapes_do_not_earn_check_3_1(tmp_path: Path) -> None:
    # The worker's reading of cache_k / cache_v is forged to Meta's shape; check 3.1
    # judges the logits of a batch that fills every row and position of the cache.
    forge = ("class RMSNorm(nn.Module):", FORGE_PART3_SHAPES + "class RMSNorm(nn.Module):")
    submission = patched_solution(tmp_path / "part3", "llama/model.py", [HALF_CACHE, forge])
    graded = run_grade(
        submission,
        tmp_path / "out3",
        parts=["part3"],
        limits=PART3_LIMITS,
        skip_tags=frozenset({"benchmark"}),
    )
    assert graded.score("3.1") == 0
    message = graded.output("3.1")
    assert "batch 4 (max_batch_size), 128 tokens (max_seq_len)" in message
    assert "Hint, as your process reports them" in message  # shown, never judged
    assert graded.score("3.3") == graded.test("3.3")["max_score"]  # short prompts fit


# ------------------------------------------------- a cache-free path slowed on purpose


# Every cache-free step runs the model 5 times (4 of them out of the worker's count), so
# the cache-free path costs 5 times what it should: both paths' ratios are inflated.
# The cache-free path runs forward four more times per step, past the grader's record of
# forward calls (the function under the grader's counting wrapper, where there is one).
BURNS_WITHOUT_CACHE = (
    "                logits = self.forward(tokens)[0][:, -1, :]  # whole sequence, every step\n",
    "                logits = self.forward(tokens)[0][:, -1, :]  # whole sequence, every step\n"
    "                for _ in range(0 if use_cache else 4):\n"
    "                    unrecorded = type(self).forward\n"
    "                    getattr(unrecorded, '__wrapped__', unrecorded)(self, tokens)\n",
)


@ATTACK
def test_a_slowed_cache_free_path_does_not_earn_check_2_9(tmp_path: Path) -> None:
    # Cache-free (the whole prefix recomputed at every cached step, the call counts forged),
    # with a cache-free path 5 times too slow: the work ratio passes, the growth does not.
    edits = [RECOMPUTES, BURNS_WITHOUT_CACHE]
    graded = grade_part2(tmp_path, edits, FORGE_PART2_LENGTHS)
    assert graded.score("2.9") == 0
    message = graded.output("2.9")
    assert "did not do less work" not in message  # the inflated work ratio alone passed
    assert "did not keep the cost of a step flat" in message
    assert "Growth probe" in message and "CPU time per new token" in message
    assert graded.score("2.11") == 0  # its cached time, against the reference's
    judged = next(line for line in graded.output("2.11").splitlines() if "reference's" in line)
    assert "[NOT MET]" in judged
    assert graded.score("2.8") == graded.test("2.8")["max_score"]  # its outputs are right


# Part 3: the cache-free path runs its step's forward three more times, unrecorded, so
# generate(kv_caching=False) costs four times what it must.
SLOW_NO_CACHE = (
    "                logits = self(tokens[:, :cur_pos], 0)  # the whole prefix, every step\n",
    "                logits = self(tokens[:, :cur_pos], 0)  # the whole prefix, every step\n"
    "                for _ in range(3):  # CPU burnt on purpose, past the call record\n"
    "                    type(self).forward(self, tokens[:, :cur_pos], 0)\n",
)


@ATTACK
def test_a_slowed_cache_free_path_does_not_earn_check_3_7(tmp_path: Path) -> None:
    # Cache-free in disguise (prev_pos never advances, the call record forged) beside a
    # cache-free path that burns CPU: the work ratio of the two paths looks like a
    # cache's, but the cached path's CPU time per token grows with the length.
    forge = ("def sample_top_p(", FORGE_PART3_CALLS + "def sample_top_p(")
    edits = [PREV_POS_STUCK, forge, SLOW_NO_CACHE]
    graded = grade_part3(tmp_path, edits, skip_tags=frozenset({"benchmark"}))
    assert graded.score("3.7") == 0
    message = graded.output("3.7")
    assert "did not do much less work" not in message  # the inflated work ratio passed
    assert "did not keep the cost of a decode step flat" in message
    assert "Growth probe (" in message  # its figures are shown
    assert graded.score("3.5") == graded.test("3.5")["max_score"]  # its text is right
