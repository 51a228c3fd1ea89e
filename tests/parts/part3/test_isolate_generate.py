"""Part 3's greedy text read token by token (grader/parts/part3/isolate_generate.py):
generate mistakes the mutant library does not hold, each graded on check 3.5, its feedback
naming the narrowed place and no other cause; the grader's own greedy continuations give
the stored texts; the library's stop-token and call causes are left as they were."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grader.parts.part3.reference import ReferenceLlama
from grader.runtime.context import load_cases
from tests.conftest import SOLUTION, one_kept_quick
from tests.parts.part3.test_checks import grade_numbers

GENERATION = "llama/generation.py"

MISTAKES = {
    # One token more than asked for.
    "one_more_token": (
        "generated = t[start : start + max_gen_len]",
        "generated = t[start : start + max_gen_len + 1]",
        "isolated:one_token_too_many", "one new token more than max_gen_len = 16",
    ),
    # One token fewer.
    "one_token_fewer": (
        "generated = t[start : start + max_gen_len]",
        "generated = t[start : start + max_gen_len - 1]",
        "isolated:one_token_short", "without its last token",
    ),
    # The longer prompts' own tokens overwritten by the model's choices.
    "prompt_overwritten": (
        "            chosen = torch.where(is_prompt[:, cur_pos], tokens[:, cur_pos], chosen)\n",
        "",
        "isolated:prompt_overwritten", "decoding starts at min_prompt_len = 10",
    ),
    # Every text cut from where decoding started, the shortest prompt's end.
    "sliced_from_min_prompt_len": (
        "            start = len(prompt_tokens[k])",
        "            start = min_prompt_len",
        "isolated:text_sliced_from_wrong_position", "(min_prompt_len, the same for every row)",
    ),
    # The next token from the first position's logits, not the last one's.
    "first_position_logits": (
        "chosen = next_token(logits[:, -1], temperature, top_p)  # (B,)",
        "chosen = next_token(logits[:, 0], temperature, top_p)  # (B,)",
        "isolated:greedy_choice_wrong", "from logits that are right there",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", one_kept_quick(sorted(MISTAKES)))
def test_a_generate_mistake_nobody_listed_is_read_token_by_token(tmp_path: Path, name: str) -> None:
    old, new, cause, place = MISTAKES[name]
    graded = grade_numbers(tmp_path, GENERATION, [(old, new)], {"3.5"})
    message = graded.output("3.5")
    assert graded.score("3.5") == 0, message
    assert graded.test("3.5")["extra_data"]["causes"] == [cause], message  # nothing else
    assert place in message, message
    assert "did not stop at" not in message


def test_the_graders_greedy_continuations_are_the_stored_texts() -> None:
    cases = load_cases("part3")
    sys.path.insert(0, str(SOLUTION))
    try:
        from llama.tokenizer import Tokenizer
    finally:
        sys.path.remove(str(SOLUTION))
    tok = Tokenizer(str(Path("test_cases/public") / cases["checkpoint"] / "tokenizer.model"))
    ref = ReferenceLlama.of(cases["models"]["public"])
    stop = cases["stop_generate"]
    ids = [tok.encode(p, bos=True, eos=False) for p in stop["prompts"]]
    total = min(cases["max_seq_len"], stop["max_gen_len"] + max(map(len, ids)))
    for prompt, want in zip(ids, stop["expected_texts"], strict=True):
        new = ref.greedy(prompt, total - len(prompt), cases["max_seq_len"])[len(prompt) :]
        new = new[: stop["max_gen_len"]]
        cut = next((i for i, t in enumerate(new) if t in tok.stop_tokens), len(new))
        assert tok.decode(new[:cut]) == want
