"""Caches that do part of the work again, written from their description, must lose the
benchmark points on the cpu profile while the reference keeps them (its 2.11 is checked
by ``tests/parts/part2/test_checks.py`` on the shared graded solution)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.sandbox.sandbox import Limits
from tests.conftest import FAST_LIMITS, PART2_LIMITS, patched_solution, run_grade

PART3_LIMITS = Limits(request_timeout_s=30.0, startup_timeout_s=30.0)

# Part 2: each layer caches its input x (twice, so the pair has the cache's shapes) and
# every step projects every position again with W_k and W_v: right logits, right shapes.
LAYER_INPUT_CACHE = [
    (
        """        k = self.W_k(x)  # (B, T_new, D)
        v = self.W_v(x)  # (B, T_new, D)
        if use_cache and past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=1)  # (B, T_total, D)
            v = torch.cat([past_kv[1], v], dim=1)  # (B, T_total, D)
""",
        """        seen = torch.cat([past_kv[0], x], 1) if use_cache and past_kv is not None else x
        k = self.W_k(seen)  # every position projected again, every step
        v = self.W_v(seen)
""",
    ),
    (
        "        return self.W_o(context), ((k, v) if use_cache else None)\n",
        "        return self.W_o(context), ((seen, seen) if use_cache else None)\n",
    ),
]


def test_a_cache_of_layer_inputs_loses_the_benchmark(tmp_path: Path) -> None:
    submission = patched_solution(tmp_path / "sub", "transformer_skeleton.py", LAYER_INPUT_CACHE)
    graded = run_grade(
        submission, tmp_path / "out", parts=["part2"], limits=PART2_LIMITS,
        numbers=frozenset({"2.4", "2.11"}),
    )  # fmt: skip
    assert graded.score("2.4") == graded.test("2.4")["max_score"]  # its logits are right
    assert graded.score("2.11") == 0
    output = graded.output("2.11")
    assert "The speedup cannot count" in output
    assert "does not hold the keys of the tokens seen" in output


# Part 2: generate starts over (a prefill of the whole sequence) every 8th step.
EVERY_8TH_STEP = [("            elif step == 0:\n", "            elif step % 8 == 0:\n")]
# Part 2: every step feeds the last 16 tokens again against a cache shortened to match:
# constant work per step, 16 times a cache's.
LAST_16_AGAIN = [
    (
        "                logits, past_kv = self.decode_one_token(tokens[:, -1:], past_kv)\n",
        "                r = min(16, tokens.shape[1])\n"
        "                kept = [(k[:, : tokens.shape[1] - r], v[:, : tokens.shape[1] - r])\n"
        "                        for k, v in past_kv]\n"
        "                out, past_kv = self.forward(tokens[:, -r:], kept, True)\n"
        "                logits = out[:, -1, :]\n",
    )
]


@pytest.mark.parametrize(
    "edits", [EVERY_8TH_STEP, LAST_16_AGAIN], ids=["every-8th-step", "last-16-again"]
)
def test_a_cache_that_recomputes_part_of_the_work_loses_the_benchmark(
    tmp_path: Path, edits: list[tuple[str, str]]
) -> None:
    submission = patched_solution(tmp_path / "sub", "transformer_skeleton.py", edits)
    graded = run_grade(
        submission, tmp_path / "out", parts=["part2"], limits=PART2_LIMITS,
        numbers=frozenset({"2.8", "2.11"}),
    )  # fmt: skip
    assert graded.score("2.8") == graded.test("2.8")["max_score"]  # its tokens are right
    assert graded.score("2.11") == 0
    assert "recomputes part of the work" in graded.output("2.11")


# Part 4: generate_with_cache throws its cache away every 16 tokens and feeds the whole
# sequence again.
REBUILD_EVERY_16 = [
    (
        "    for _ in range(L):\n        out = model(new, past_key_values=cache, use_cache=True)\n",
        "    for step in range(L):\n"
        "        if step and step % 16 == 0:\n"
        "            cache, new = None, ids  # starts over: the whole sequence again\n"
        "        out = model(new, past_key_values=cache, use_cache=True)\n",
    )
]


def test_a_lab_cache_rebuilt_every_16_tokens_loses_the_latency_check(tmp_path: Path) -> None:
    submission = patched_solution(tmp_path / "sub", "kv_lab.py", REBUILD_EVERY_16)
    graded = run_grade(
        submission, tmp_path / "out", parts=["part4"], limits=FAST_LIMITS,
        numbers=frozenset({"4.2", "4.6"}),
    )  # fmt: skip
    assert graded.score("4.2") == graded.test("4.2")["max_score"]  # its tokens are right
    assert graded.score("4.6") == 0
    assert "recomputes part of the work" in graded.output("4.6")


# Part 3: every 8th step sets prev_pos back to 0, so that step feeds the whole prefix.
LLAMA_EVERY_8TH_STEP = [
    (
        "            prev_pos = cur_pos\n",
        "            prev_pos = 0 if (cur_pos - min_prompt_len) % 8 == 7 else cur_pos\n",
    )
]


def test_a_llama_cache_that_starts_over_every_8th_step_loses_the_benchmark(
    tmp_path: Path,
) -> None:
    submission = patched_solution(tmp_path / "sub", "llama/generation.py", LLAMA_EVERY_8TH_STEP)
    graded = run_grade(
        submission, tmp_path / "out", parts=["part3"], limits=PART3_LIMITS,
        numbers=frozenset({"3.8", "3.11"}),
    )  # fmt: skip
    assert graded.score("3.8") == graded.test("3.8")["max_score"], graded.output("3.8")
    assert graded.score("3.11") == 0
    assert "recomputes part of the work" in graded.output("3.11")
