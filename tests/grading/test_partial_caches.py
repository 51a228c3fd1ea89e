"""Caches that do part of the work again, written from their description, must lose the
benchmark points on the cpu profile while the reference keeps them (its 2.11 is checked
by ``tests/parts/part2/test_checks.py`` on the shared graded solution)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import PART2_LIMITS, patched_solution, run_grade

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
