"""Where a greedy ``generate`` goes wrong, narrowed token by token after its text differed.

The worker records what every forward call of the generate fed the model, by row and
position (``adapter_isolate.FedTokens``); the grader's own model (:mod:`.reference`)
continues each prompt greedily, and is trusted only where its texts are the stored ones.
Each row's fed tokens are then read against the reference's sequence, position by
position, and the first that differs says which of three places is wrong:

1. **A prompt's own tokens** (a position inside the prompt): the prompt overwritten by the
   model's choice (at or after ``min_prompt_len``, where decoding starts) or fed wrong.
2. **A new token**: the first chosen token that differs, with the step's logits against
   the reference's for the same prefix: right logits and another token is the choice
   (the argmax); wrong logits are the forward of that step (the prefill, or which decode
   step), with the tokens before it right.
3. **The text**, where every fed token is right: the text against the reference's tokens,
   one token too many or too few, or sliced from another position than after the prompt.

Run only after a check of greedy text failed; nothing is said that the record does not
show (a reply without the record, rows of another count, a reference that does not give
the stored texts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.parts.part3.isolate_forward import references
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part3.reference import ReferenceLlama
    from grader.parts.part3.support import Part3Base

EOT = "<|eot_id|>"


@dataclass(frozen=True)
class Run:
    """One generate to explain: its prompts' ids, its settings and what it returned."""

    prompts: list[list[int]]
    max_gen_len: int
    max_seq_len: int
    stops: set[int]
    texts: list[Any]
    want: list[str]
    fed: np.ndarray
    calls: list[Any]
    step_logits: Any
    cache: bool

    @property
    def total_len(self) -> int:
        return min(self.max_seq_len, self.max_gen_len + max(len(p) for p in self.prompts))

    @property
    def min_len(self) -> int:
        return min(len(p) for p in self.prompts)

    def new_tokens(self, seq: list[int], k: int) -> list[int]:
        """Row ``k``'s returned tokens of a full sequence ``seq``, cut at the first stop."""
        out = seq[len(self.prompts[k]) : len(self.prompts[k]) + self.max_gen_len]
        return cut(out, self.stops)


def cut(tokens: list[int], stops: set[int]) -> list[int]:
    stop = next((i for i, t in enumerate(tokens) if t in stops), None)
    return tokens if stop is None else tokens[:stop]


def ask(check: Part3Base, header: dict[str, Any], what: str) -> dict[str, Any] | None:
    try:
        return check.call({"model": "public", "kv_caching": True, **header}, {}, what).header
    except SubmissionError:
        return None


def narrow_generation(
    check: Part3Base, reply: Any, prompts: list[str], want: list[str], cache: bool, **kw: Any
) -> list[Cause]:
    """The causes the token-by-token reading singles out for a greedy ``reply`` of
    ``prompts`` whose texts are not ``want`` (``kw``: model, max_gen_len); [] where it
    cannot tell. Never raises."""
    try:
        return explain(check, reply, prompts, want, cache, **kw)
    except Exception:  # an optional hint: the check's own message stands without it
        return []


def explain(
    check: Part3Base, reply: Any, prompts: list[str], want: list[str], cache: bool, **kw: Any
) -> list[Cause]:
    model = kw.get("model", "public")
    refs = references(check, model)
    fed = reply.arrays.get("fed_tokens")
    header = reply.header if isinstance(reply.header, dict) else {}
    texts = header.get("texts")
    if not refs or not isinstance(fed, np.ndarray) or not isinstance(texts, list):
        return []
    encoded = ask(check, {"op": "encode", "tokenizer": "public", "prompts": prompts}, "encode")
    if encoded is None or fed.ndim != 2 or len(fed) != len(prompts):
        return []
    stops = stop_ids(check)
    run = Run(
        [list(map(int, p)) for p in encoded["ids"]],
        int(kw.get("max_gen_len") or check.meta()["generate"]["max_gen_len"]),
        int(check.raw()["max_seq_len"]),
        stops,
        texts,
        want,
        fed,
        header.get("calls") or [],
        reply.arrays.get("step_logits"),
        cache,
    )
    ref = refs[0]
    seqs = [ref.greedy(p, run.total_len - len(p) + 1, run.max_seq_len) for p in run.prompts]
    mine = decode(check, [run.new_tokens(s, k) for k, s in enumerate(seqs)])
    if mine != want:  # the reference must give the stored texts, or it says nothing
        return []
    return fed_causes(ref, run, seqs) or text_causes(check, run, seqs)


def stop_ids(check: Part3Base) -> set[int]:
    """The ids of <|end_of_text|> and <|eot_id|> in the public tokenizer's texts."""
    texts = check.raw()["token_texts"]
    return {i for i, t in enumerate(texts) if t in ("<|end_of_text|>", EOT)}


def decode(check: Part3Base, rows: list[list[int]]) -> list[str] | None:
    got = ask(check, {"op": "decode", "tokenizer": "public", "rows": rows}, "decode")
    return None if got is None else got.get("texts")


def first_mismatch(run: Run, seqs: list[list[int]]) -> tuple[int, int] | None:
    """The first (row, position) whose fed token is not the reference's; None where every
    fed position of every row holds the reference's token."""
    for k, seq in enumerate(seqs):
        fed = run.fed[k]
        for p in range(min(len(fed), len(seq))):
            if fed[p] >= 0 and int(fed[p]) != seq[p]:
                return k, p
    return None


def fed_causes(ref: ReferenceLlama, run: Run, seqs: list[list[int]]) -> list[Cause]:
    """What the first fed token that differs from the reference's shows (places 1, 2)."""
    found = first_mismatch(run, seqs)
    if found is None:
        return []
    k, p = found
    got, right = int(run.fed[k][p]), seqs[k][p]
    prefix = [int(t) for t in run.fed[k][:p]]
    where = f"position {p} of row {k + 1}"
    evidence = f"the tokens your generate fed the model, against the reference's: {where}"
    if p < len(run.prompts[k]):
        if p == 0:
            return []  # the first token: BOS or a left pad, named by course.first_token_causes
        chose = int(np.argmax(ref.stages(np.array([prefix]), last_only=True)["logits"]))
        if p >= run.min_len:
            origin = "the token chosen there from the logits" if got == chose else "another token"
            return [
                Cause(
                    "isolated:prompt_overwritten",
                    f"your generate overwrites the longer prompts of a ragged batch: it fed the "
                    f"model {got} ({origin}) at {where}, where that row's prompt holds {right}; "
                    f"decoding starts at min_prompt_len = {run.min_len}, and inside a longer "
                    "prompt its own token must stay (torch.where(is_prompt[:, cur_pos], "
                    "tokens[:, cur_pos], next_token))",
                    evidence,
                )
            ]
        return [
            Cause(
                "isolated:prompt_fed_wrong",
                f"your generate fed the model {got} at {where}, inside every prompt (before "
                f"min_prompt_len = {run.min_len}), where the prompt holds {right}: each row "
                "must start with its prompt's ids, as tokenizer.encode gives them",
                evidence,
            )
        ]
    return [step_cause(ref, run, k, p, prefix, got, right, evidence)]


def step_cause(
    ref: ReferenceLlama,
    run: Run,
    k: int,
    p: int,
    prefix: list[int],
    got: int,
    right: int,
    evidence: str,
) -> Cause:
    """A new token that differs: the step's logits against the reference's for the same
    (right) prefix tell the choice from the forward."""
    j = p - len(run.prompts[k]) + 1
    want = ref.stages(np.array([prefix]), last_only=True)["logits"][0, -1]
    step = next(
        (i for i, (s, n) in enumerate(run.calls) if int(s) + int(n) == p), None
    )  # the call whose last position chose position p
    seen = step_logits(run.step_logits, step, k, want.shape[0])
    token = f"new token {j} of row {k + 1} (position {p})"
    mode = f"generate(kv_caching={run.cache})"
    if seen is not None and np.abs(seen - want).max() <= 1e-4 * max(1.0, np.abs(want).max()):
        return Cause(
            "isolated:greedy_choice_wrong",
            f"your {mode} chose {got} as {token} from logits that are right there, whose "
            f"largest entry is {right}: at temperature 0 the next token is the argmax of the "
            "last position's logits of each row (over the vocabulary, dim=-1)",
            f"{evidence}; the step's logits against the reference's for the same tokens",
        )
    if seen is None:
        text = (
            f"your {mode} fed the reference's tokens up to {token}, which is the first "
            f"that differs ({got} where the reference chose {right})"
        )
        return Cause("isolated:generation_departs_at_step", text, evidence)
    start, n = (int(x) for x in run.calls[step])
    call = (
        "the prefill, the first call"
        if step == 0
        else f"the {step}{'st' if step == 1 else 'th'} call after the prefill, at start_pos "
        f"{start} with {n} token(s)"
    )
    diff = np.abs(seen - want)
    err = float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan")  # NaN logits
    return Cause(
        "isolated:generation_departs_at_step",
        f"your {mode} fed the model the reference's tokens up to {token}, but the logits of "
        f"{call} depart from the reference's for the same tokens by up to {err:.3g}, so it "
        f"chose {got} where the reference chose {right}: the model's forward in that call "
        "is wrong (see the forward checks 3.2 to 3.4)",
        f"{evidence}; the step's logits against the reference's for the same tokens",
    )


def step_logits(logits: Any, step: int | None, k: int, vocab: int) -> np.ndarray | None:
    """Row ``k``'s recorded last-position logits of call ``step`` (None where not there)."""
    if step is None or not isinstance(logits, np.ndarray) or logits.ndim != 3:
        return None
    if step >= len(logits) or k >= logits.shape[1] or logits.shape[2] != vocab:
        return None
    return logits[step, k].astype(np.float64)


def text_causes(check: Part3Base, run: Run, seqs: list[list[int]]) -> list[Cause]:
    """Every fed token right: the returned text against the reference's tokens (place 3)."""
    wrong = [k for k, (g, w) in enumerate(zip(run.texts, run.want, strict=False)) if g != w]
    if not wrong or any(run.texts[k] == run.want[k] + EOT for k in wrong):
        return []  # the stop token kept: isolate.kept_stop_causes says so
    kinds: dict[str, list[list[int]]] = {}
    for k in wrong:
        seq, start, mine = seqs[k], len(run.prompts[k]), run.new_tokens(seqs[k], k)
        full = len(mine) == len(seq[start : start + run.max_gen_len])  # not cut by a stop
        if full and start + len(mine) < len(seq):
            kinds.setdefault("extra", []).append(seq[start : start + len(mine) + 1])
        if mine:
            kinds.setdefault("short", []).append(mine[:-1])
    for kind, rows in list(kinds.items()):
        if len(rows) != len(wrong) or decode(check, rows) != [run.texts[k] for k in wrong]:
            del kinds[kind]
    rows = [k + 1 for k in wrong]
    if set(kinds) == {"extra"}:
        return [
            Cause(
                "isolated:one_token_too_many",
                f"your generate returns one new token more than max_gen_len = "
                f"{run.max_gen_len}: the text of prompt(s) {rows} is the reference's followed by "
                "the next token it would choose; keep tokens[len(prompt) : len(prompt) + "
                "max_gen_len] of each row",
                "the texts against the reference's tokens, every fed token right",
            )
        ]
    if set(kinds) == {"short"}:
        return [
            Cause(
                "isolated:one_token_short",
                f"your generate returns one token fewer than the reference for prompt(s) "
                f"{rows}: their text is the reference's without its last token (the loop runs "
                f"cur_pos from min_prompt_len up to total_len = min(max_seq_len, max_gen_len + "
                "max_prompt_len), and each row keeps max_gen_len tokens after its prompt)",
                "the texts against the reference's tokens, every fed token right",
            )
        ]
    return offset_causes(check, run, seqs, wrong)


def offset_causes(
    check: Part3Base, run: Run, seqs: list[list[int]], wrong: list[int]
) -> list[Cause]:
    """Each wrong text sliced from another position of the reference's sequence than
    after its prompt: one slice start per row, named when every wrong row has one."""
    starts: list[int] = []
    for k in wrong:
        seq, start = seqs[k], len(run.prompts[k])
        candidates = [a for a in range(start + 3) if a != start]
        rows = [cut(seq[a : a + run.max_gen_len], run.stops) for a in candidates]
        texts = decode(check, rows) or []
        hits = [a for a, t in zip(candidates, texts, strict=False) if t == run.texts[k]]
        if len(hits) != 1:
            return []
        starts.append(hits[0])
    said = ", ".join(
        f"prompt {k + 1} from position {a} (its prompt ends at {len(run.prompts[k])})"
        for k, a in zip(wrong, starts, strict=True)
    )
    uniform = len(set(starts)) == 1 and starts[0] == run.min_len
    why = " (min_prompt_len, the same for every row)" if uniform else ""
    return [
        Cause(
            "isolated:text_sliced_from_wrong_position",
            f"your generate's text starts at another position of the sequence than right "
            f"after the prompt: {said}{why}. Each row's text is tokens[len(prompt) : "
            "len(prompt) + max_gen_len], cut at its first stop token",
            "the texts against the reference's tokens, every fed token right",
        )
    ]
