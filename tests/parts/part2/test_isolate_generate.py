"""Part 2's isolation of generate and its sampler: generate's output against the reference's
greedy tokens, token by token, and ``sample`` alone on a distribution the grader chose with
the temperature varied alone. Unlisted mistakes are named by what the experiment showed;
a known sampler mistake that gives the same tokens for another reason is not named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grader.parts.part2.cases import softmax64
from grader.parts.part2.isolate_generate import NEW, PROMPT, compare
from grader.parts.part2.isolate_sampling import HYPOTHESES, LOGITS, ROWS, Draws, sampler_verdict
from grader.ta.mutants import load_mutants
from tests.conftest import library_edits, one_kept_quick
from tests.parts.part2.test_checks import grade_edit

MUTANTS = {m.name: m for m in load_mutants("part2", combined=False)}
TEMPERATURE_IGNORED = MUTANTS["temperature_ignored"].diagnosis
SAMPLER = "sample must draw from softmax(logits / temperature)"
LOOP_END = (
    "            tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + step + 1)\n"
    "        return tokens\n"
)
SOFTMAX = "probs = F.softmax(logits / temperature, dim=-1)"
BUFFER = (
    "        out = torch.zeros_like(tokens)\n"
    "        out[:, input_ids.shape[1] :] = tokens[:, input_ids.shape[1] :]\n"
    "        return out\n"
)
MISTAKES = {
    # One step too many.
    "extra_step": (
        [("for step in range(max_new_tokens):", "for step in range(max_new_tokens + 1):")],
        "2.8",
        ["isolated:generate_extra_token"],
        ["followed by one token more (13 tokens where 12 belong)"],
    ),
    # The output written into a buffer whose prompt part is never filled.
    "prompt_not_copied": (
        [(LOOP_END, LOOP_END.replace("        return tokens\n", BUFFER))],
        "2.8",
        ["isolated:generate_prompt_overwritten"],
        ["its 6 new tokens are the reference's, but the prompt in front of them is changed "
         "at positions 1, 2, 3"],
    ),
    # The first decode step forgets the prefill's cache.
    "first_step_without_cache": (
        [("self.decode_one_token(tokens[:, -1:], past_kv)",
          "self.decode_one_token(tokens[:, -1:], past_kv if step > 1 else None)")],
        "2.8",
        ["isolated:generate_cached_step_departs"],
        ["with use_cache=True: the prompt is kept and its first 1 new token(s) are the "
         "reference's, but new token 2 of 6 departs; with use_cache=False: right",
         "look at what decode step 1 after the prefill feeds forward"],
    ),
    # The temperature multiplied in.
    "temperature_multiplied": (
        [(SOFTMAX, SOFTMAX.replace("logits / temperature", "logits * temperature"))],
        "2.10",
        ["isolated:sampler_temperature_multiplied"],
        ["multiplies the logits by the temperature instead of dividing"],
    ),
    # The softmax over the batch: identical rows give every token the same probability.
    "softmax_over_rows": (
        [(SOFTMAX, SOFTMAX.replace("dim=-1", "dim=0"))],
        "2.10",
        ["isolated:sampler_temperature_uniform"],
        ["draws every token equally often", SAMPLER],
    ),
}  # fmt: skip


def test_the_mistakes_are_not_in_the_mutant_library() -> None:
    library = library_edits("part2", combined=False)
    for edits, *_ in MISTAKES.values():
        assert not set(edits) & library


@pytest.mark.parametrize("name", one_kept_quick(sorted(MISTAKES)))
def test_an_unlisted_mistake_is_named_by_the_experiment(tmp_path: Path, name: str) -> None:
    edits, check, causes, words = MISTAKES[name]
    graded = grade_edit(tmp_path, edits, {check})
    message = graded.output(check)
    assert graded.score(check) == 0
    assert graded.test(check)["extra_data"]["causes"] == causes, message
    for text in words:
        assert text in message, message
    assert TEMPERATURE_IGNORED not in message


def test_generate_dropping_its_temperature_is_not_blamed_on_the_sampler(tmp_path: Path) -> None:
    """generate hands sample 1.0: the same tokens as the library's temperature_ignored (a
    sampler that ignores it), which the catalogue names; sample alone is right, so the
    experiment names generate instead."""
    edit = (
        "next_token = self.sample(logits, temperature)",
        "next_token = self.sample(logits, 1.0)",
    )
    graded = grade_edit(tmp_path, [edit], {"2.10"})
    message = graded.output("2.10")
    assert graded.test("2.10")["extra_data"]["causes"] == ["isolated:generate_ignores_temperature"]
    assert "it draws from softmax(logits / T) at every one" in message
    assert TEMPERATURE_IGNORED not in message


def test_the_library_sampler_mistake_keeps_its_words(tmp_path: Path) -> None:
    graded = grade_edit(tmp_path, list(MUTANTS["temperature_ignored"].edits), {"2.10"})
    message = graded.output("2.10")
    assert graded.test("2.10")["extra_data"]["causes"] == ["temperature_ignored"]
    assert TEMPERATURE_IGNORED in message
    assert "at T=0.5 the likeliest token" in message  # the experiment agrees, and says so


def test_a_library_generate_mistake_gets_no_other_cause(tmp_path: Path) -> None:
    graded = grade_edit(tmp_path, list(MUTANTS["generate_refeeds_with_cache"].edits), {"2.8"})
    causes = graded.test("2.8").get("extra_data", {}).get("causes", [])
    assert [c for c in causes if c.startswith("isolated:")] in (
        [],
        ["isolated:generate_cached_step_departs"],
    ), graded.output("2.8")


# ------------------------------------------------------------------- the comparisons alone


def test_generate_outputs_against_the_reference() -> None:
    rng = np.random.default_rng(3)
    want = rng.integers(0, 1000, size=(1, PROMPT + NEW))
    assert compare(want, want) is None
    assert compare(want[:, PROMPT:], want) is None  # only the new tokens: accepted
    extra = np.concatenate([want, want[:, -1:]], axis=1)
    assert compare(extra, want)[0] == "isolated:generate_extra_token"
    assert compare(want[:, :-1], want)[0] == "isolated:generate_one_short"
    shifted = np.concatenate([want[:, 1:], want[:, -1:] + 1], axis=1)
    assert compare(shifted, want)[0] == "isolated:generate_output_shifted"
    late = want.copy()
    late[0, PROMPT + 3] += 1
    assert compare(late, want)[0] == "isolated:generate_departs_at_step_4"
    assert compare(rng.integers(0, 1000, size=(1, 3)), want) is None  # fits nothing


def exact(temperature_of) -> Draws:
    z = np.array(LOGITS)
    return Draws({t: softmax64(z / temperature_of(t)) for t in (1.0, 0.5, 2.0, 0.001)})


@pytest.mark.parametrize("name", [n for n in HYPOTHESES if n != "divided"])
def test_each_sampler_hypothesis_is_singled_out_by_its_draws(name: str) -> None:
    assert sampler_verdict(exact(HYPOTHESES[name][0]))[0] == name
    assert sampler_verdict(exact(lambda t: t))[0] == "divided"
    assert ROWS >= 1000


def test_draws_that_fit_no_temperature_name_no_hypothesis() -> None:
    z = np.floor(np.array(LOGITS))
    found = Draws({t: softmax64(z / t) for t in (1.0, 0.5, 2.0, 0.001)})
    assert sampler_verdict(found)[0] is None
    assert sampler_verdict(Draws(None, "TypeError"))[0] is None
