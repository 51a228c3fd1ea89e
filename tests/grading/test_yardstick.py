"""The reference as the yardstick: hostile cache-free designs that make every ratio of
their own two paths look like a cache's (a cache-free path slowed on purpose, short
cached runs padded so that the cost per token looks flat, forged call records) lose the
benchmark points, because their cached time is judged against the reference's cached
path, timed in the same grading by a trusted worker."""

from __future__ import annotations

import shutil
from pathlib import Path

from grader.ta.calibrate import cache_free_submission
from tests.conftest import ATTACK, PART2_LIMITS, grade_checks, patched_solution
from tests.grading.test_hostile_measures import (
    BURNS_WITHOUT_CACHE,
    FORGE_PART2_LENGTHS,
    FORGE_PART3_CALLS,
    PART3_LIMITS,
    PREV_POS_STUCK,
    RECOMPUTES,
    SLOW_NO_CACHE,
)

# Part 2: a cached run recomputes the whole sequence at every step (RECOMPUTES) and, on a
# short sequence, runs the model once more over 124 throwaway positions, so that its CPU
# time per token is about the same for 16 new tokens as for 248: the growth probe sees a
# flat line.
PADS_SHORT_RUNS = (
    "            next_token = self.sample(logits, temperature)  # (B, 1)\n",
    "            room = self.pos_embedding.num_embeddings - tokens.shape[1]\n"
    "            if use_cache and max_new_tokens < 128 and 0 < room and tokens.shape[1] < 64:\n"
    "                filler = tokens[:, :1].repeat(1, min(124, room))  # throwaway work\n"
    "                type(self).forward(self, torch.cat([tokens, filler], dim=1))\n"
    "            next_token = self.sample(logits, temperature)  # (B, 1)\n",
)


@ATTACK
def test_a_padded_cache_free_generate_loses_check_2_11(tmp_path: Path) -> None:
    anchor = "# One layer's cache"
    edits = [RECOMPUTES, BURNS_WITHOUT_CACHE, PADS_SHORT_RUNS,
             (anchor, FORGE_PART2_LENGTHS + anchor)]  # fmt: skip
    submission = patched_solution(tmp_path / "sub", "transformer_skeleton.py", edits)
    graded = grade_checks(submission, tmp_path / "out", "part2", {"2.9", "2.11"}, PART2_LIMITS)
    # Every ratio of its own two paths looks like a cache's ...
    work = graded.output("2.9")
    assert "did not keep the cost of a step flat" not in work  # the padding hides the growth
    # ... so 2.9 falls to the yardstick, or first to its growth runs' call records (the
    # throwaway padding call shows there); 2.11 to the yardstick below.
    assert (
        "reference solution's cached path on the same prompts" in work
        or "recomputes part of the work" in work
    ), work
    assert graded.score("2.9") == 0
    benchmark = graded.output("2.11")
    assert "speedup (cpu time)" in benchmark and "needed at least" in benchmark
    assert "with the cache, over the reference's (cpu time)" in benchmark
    assert "[NOT MET]" in benchmark.split("over the reference's")[1].splitlines()[0]
    assert graded.score("2.11") == 0


# Part 3: a cached step pads a short generation (the growth probe's 8-token prompts) with
# a model call over 120 throwaway positions, so that its cost per token looks flat.
PADS_SHORT_LLAMA_RUNS = (
    "            chosen = next_token(logits[:, -1], temperature, top_p)  # (B,)\n",
    "            if kv_caching and max_prompt_len < 16 and total_len < 128:\n"
    "                filler = tokens[:, :1].repeat(1, min(120, params.max_seq_len))\n"
    "                type(self).forward(self, filler, 0)  # throwaway work\n"
    "            chosen = next_token(logits[:, -1], temperature, top_p)  # (B,)\n",
)


@ATTACK
def test_a_padded_cache_free_llama_loses_check_3_11(tmp_path: Path) -> None:
    forge = ("def sample_top_p(", FORGE_PART3_CALLS + "def sample_top_p(")
    edits = [PREV_POS_STUCK, forge, SLOW_NO_CACHE, PADS_SHORT_LLAMA_RUNS]
    submission = patched_solution(tmp_path / "sub", "llama/generation.py", edits)
    graded = grade_checks(submission, tmp_path / "out", "part3", {"3.7", "3.11"}, PART3_LIMITS)
    work = graded.output("3.7")
    assert "did not keep the cost of a decode step flat" not in work  # padded: looks flat
    assert "reference solution's cached path on the same prompts" in work
    assert graded.score("3.7") == 0
    benchmark = graded.output("3.11")
    assert "batch 1 speedup (cpu time)" in benchmark  # its own ratio looks like a cache's
    judged = [line for line in benchmark.splitlines() if "over the reference's" in line]
    # The larger batches always miss; batch 1's margin is the smallest (the padding costs
    # little there) and a busy machine may leave it inside the limit: 3.11 is lost anyway.
    assert len(judged) >= 3 and all("[NOT MET]" in line for line in judged[1:3]), benchmark
    assert graded.score("3.11") == 0


def test_a_disguised_cache_free_lab_loses_check_4_6(tmp_path: Path) -> None:
    """Right tokens, a cache asked for and every step fed the whole sequence: judged
    against the reference's cached time at the longest L."""
    submission = cache_free_submission(["part4"])
    try:
        graded = grade_checks(submission, tmp_path / "out", "part4", {"4.6"})
    finally:
        shutil.rmtree(submission, ignore_errors=True)
    line = next(
        line for line in graded.output("4.6").splitlines() if "over the reference's" in line
    )
    assert line.startswith("  with the cache, L = 256, over the reference's (cpu time)")
    assert "[NOT MET]" in line
    assert graded.score("4.6") == 0


# Part 2: generate(use_cache=True) hands the whole job to a grandchild (the middle process
# exits at once, so the grandchild is an orphan), which recomputes the prefix at every
# step, sends the tokens back through a pipe and exits before the worker answers; the
# call records are forged. The grandchild's CPU time is counted (the grader is the
# subreaper of its workers' orphans), so the cached path costs what a cache-free one does.
IN_A_GRANDCHILD = (
    "    def generate(\n",
    "    def generate(self, input_ids, max_new_tokens, temperature=1.0, use_cache=True):\n"
    "        if not use_cache:\n"
    "            return self._generate(input_ids, max_new_tokens, temperature, False)\n"
    "        import pickle\n"
    "        r, w = os.pipe()\n"
    "        if os.fork() == 0:\n"
    "            if os.fork() == 0:\n"
    "                os.close(r)\n"
    "                out = self._generate(input_ids, max_new_tokens, temperature, False)\n"
    "                with os.fdopen(w, 'wb') as f:\n"
    "                    f.write(pickle.dumps(out))\n"
    "                os._exit(0)\n"
    "            os._exit(0)\n"
    "        os.close(w)\n"
    "        os.wait()\n"
    "        with os.fdopen(r, 'rb') as f:\n"
    "            return pickle.loads(f.read())\n"
    "\n"
    "    def _generate(\n",
)


def test_cached_work_done_in_an_orphan_grandchild_loses_check_2_11(tmp_path: Path) -> None:
    anchor = "# One layer's cache"
    edits = [IN_A_GRANDCHILD, (anchor, FORGE_PART2_LENGTHS + anchor)]
    submission = patched_solution(tmp_path / "sub", "transformer_skeleton.py", edits)
    graded = grade_checks(submission, tmp_path / "out", "part2", {"2.8", "2.11"}, PART2_LIMITS)
    assert graded.score("2.8") == graded.test("2.8")["max_score"]  # its tokens are right
    benchmark = graded.output("2.11")
    speedup = next(line for line in benchmark.splitlines() if "speedup (cpu time)" in line)
    assert "[NOT MET]" in speedup, benchmark  # the grandchild's CPU time was counted
    assert graded.score("2.11") == 0


# Part 4: generate_with_cache is the cache-free loop, and a short run (L = 32) pads every
# step with a call over 140 throwaway positions, so that its time per token is what a long
# run's is: the cached growth looks flat.
PADS_SHORT_L = (
    "    return generate_with_cache_from(model, input_ids, None, L)\n",
    "    out = generate_no_cache(model, input_ids, L)\n"
    "    if L < 128:\n"
    "        filler = input_ids[:, :1].repeat(1, 140)  # throwaway work\n"
    "        for _ in range(L):\n"
    "            model(filler)\n"
    "    return out\n",
)


@ATTACK
def test_a_padded_cache_free_lab_loses_check_4_6(tmp_path: Path) -> None:
    submission = patched_solution(tmp_path / "sub", "kv_lab.py", [PADS_SHORT_L])
    graded = grade_checks(submission, tmp_path / "out", "part4", {"4.6"})
    output = graded.output("4.6")
    growth = next(line for line in output.splitlines() if "cached CPU time per token" in line)
    assert "[ok]" in growth  # the padding makes the cached path look flat
    judged = next(line for line in output.splitlines() if "over the reference's" in line)
    assert "[NOT MET]" in judged
    assert graded.score("4.6") == 0
