"""Check 3.10's experiments (grader/parts/part3/isolate_sampling.py): the temperature and
top-p varied alone name the half that is wrong; sample_top_p at several p names how; the
goodness of fit accepts a right sampler's draws and rejects a flattened one's; the
library's temperature_ignored is still named, alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grader.parts.part3.isolate_sampling import PS, ROW, fits, nucleus
from grader.ta.mutants import load_mutants
from tests.conftest import one_kept_quick
from tests.parts.part3.test_checks import grade_numbers

GENERATION = "llama/generation.py"

MISTAKES = {
    "temperature_multiplied": (
        "probs = torch.softmax(logits / temperature, dim=-1)",
        "probs = torch.softmax(logits * temperature, dim=-1)",
        "isolated:temperature_multiplied", "multiplies the logits by the temperature",
    ),
    "ranks_not_ids": (
        "    return torch.gather(probs_idx, -1, choice)\n",
        "    return choice\n",
        "isolated:top_p_returns_ranks", "not their ids",
    ),
    "ascending_sort": (
        "probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)",
        "probs_sort, probs_idx = torch.sort(probs, dim=-1)",
        "isolated:top_p_sorted_ascending", "keeps the least likely tokens",
    ),
    # The nucleus cut from softmax(logits), then the temperature applied to what is left.
    "top_p_before_temperature": (
        "        probs = torch.softmax(logits / temperature, dim=-1)\n"
        "        return sample_top_p(probs, top_p).reshape(-1)",
        "        order = torch.softmax(logits, dim=-1)\n"
        "        ranked, idx = torch.sort(order, dim=-1, descending=True)\n"
        "        drop = (torch.cumsum(ranked, -1) - ranked) > top_p\n"
        "        cut = logits.clone()\n"
        "        cut.scatter_(-1, idx, torch.where(drop, float('-inf'), ranked.new_zeros(())) \n"
        "                     + logits.gather(-1, idx))\n"
        "        probs = torch.softmax(cut / temperature, dim=-1)\n"
        "        return sample_top_p(probs, 1.0).reshape(-1)",
        "isolated:temperature_and_top_p_combined_wrong", "not both at once",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", one_kept_quick(sorted(MISTAKES)))
def test_a_sampling_mistake_nobody_listed_names_the_half_that_is_wrong(
    tmp_path: Path, name: str
) -> None:
    old, new, cause, words = MISTAKES[name]
    graded = grade_numbers(tmp_path, GENERATION, [(old, new)], {"3.10"})
    message = graded.output("3.10")
    assert graded.score("3.10") < 2, message
    assert graded.test("3.10")["extra_data"]["causes"] == [cause], message  # nothing else
    assert words in message, message


def test_temperature_ignored_is_still_the_librarys_alone(tmp_path: Path) -> None:
    [mutant] = [m for m in load_mutants("part3") if m.name == "temperature_ignored"]
    graded = grade_numbers(tmp_path, mutant.file, list(mutant.edits), {"3.10"})
    assert mutant.diagnosis in graded.output("3.10")
    assert graded.test("3.10")["extra_data"]["causes"] == ["temperature_ignored"]


def test_the_fit_accepts_right_draws_and_rejects_a_flatter_distribution() -> None:
    rng = np.random.default_rng(10)
    p = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02])
    want = dict(enumerate(p))
    flat = np.exp(np.log(p) * 0.6)
    flat /= flat.sum()
    for _ in range(20):
        assert fits(rng.choice(len(p), 512, p=p).tolist(), want)
    assert not fits(rng.choice(len(p), 512, p=flat).tolist(), want)
    assert not fits([0] * 511 + [7], want)  # an outcome outside the support


def test_the_probe_row_tells_every_top_p_pattern_apart() -> None:
    right = {p: sorted(nucleus(ROW, p)) for p in PS}
    ranks = {p: list(range(len(right[p]))) for p in PS}
    ascending = {p: sorted(nucleus(ROW, p, descending=False)) for p in PS}
    every = {p: list(range(len(ROW))) for p in PS}
    patterns = [right, ranks, ascending, every]
    assert all(a != b for i, a in enumerate(patterns) for b in patterns[i + 1 :])
