"""Check 3.10's isolating experiments: which half of sampling is wrong, the temperature or
top-p, and in what way.

Run only after a half of 3.10 failed, on distributions the grader chose:

- **generate's first token**, drawn as the check draws it (the probe's prompt, rows and
  seeds) with the temperature alone (``top_p = 1``: no cut) and with top-p alone
  (``T = 1``), each judged against the distribution of the submission's own logits (the
  ones it samples from). The temperature the draws with no cut follow is then one of a
  few hypotheses (:data:`TEMPERATURES`), named only when it alone fits.
- **sample_top_p** on one row whose ids are not in the order of their probabilities, at
  several ``p`` (:data:`PS`): the tokens drawn at each against the nucleus, read as the
  ranks of the nucleus (no ``torch.gather``), the nucleus of an ascending sort, every
  token (``p`` ignored), or the right tokens in the wrong proportions.

A cause is stated only for a pattern every experiment shows; the library's
``temperature_ignored`` and ``always_greedy`` are kept only where the temperature alone
shows them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.parts.part3.cases import nucleus_distribution, text_distribution
from grader.runtime.outcomes import SubmissionError

if TYPE_CHECKING:
    from grader.parts.part3.support import Part3Base

SIGMAS = 6.0
#: A chi-square statistic this many standard deviations above its mean rejects (about one
#: in a million of a right sampler's draws).
REJECT_Z = 4.75
#: The temperature the draws with no cut follow, by each way of getting it wrong.
TEMPERATURES: dict[str, Callable[[float], float]] = {
    "divided": lambda t: t,
    "temperature_ignored": lambda t: 1.0,
    "multiplied": lambda t: 1.0 / t,
    "twice": lambda t: t * t,
    "always_greedy": lambda t: 1e-6,
}
WORDS = {
    "multiplied": "multiplies the logits by the temperature instead of dividing them by it "
    "(a low temperature then flattens the distribution instead of sharpening it)",
    "twice": "divides the logits by the temperature twice",
}
#: sample_top_p's probe: ids not in the order of their probabilities, and the p varied.
ROW = (0.1, 0.05, 0.4, 0.25, 0.2)
PS = (0.3, 0.5, 0.7, 0.9)
DRAWS = 400


def fits(drawn: list[Any], want: dict[Any, float]) -> bool:
    """Whether the draws ``drawn`` follow ``want`` (outcome -> probability): none outside its
    support, and a chi-square test over its outcomes of five expected draws or more (the
    rest pooled) that does not reject at about one in a million (Wilson and Hilferty's
    normal approximation, :data:`REJECT_Z`)."""
    n = len(drawn)
    if not n or any(want.get(t, 0.0) <= 0.0 for t in drawn):
        return False
    counts = Counter(drawn)
    big = [t for t, p in want.items() if p * n >= 5]
    bins = [(counts[t], want[t] * n) for t in big]
    rest = n - sum(c for c, _ in bins), n - sum(e for _, e in bins)
    if rest[1] >= 5:
        bins.append(rest)
    elif rest[0] > rest[1] + SIGMAS * np.sqrt(max(rest[1], 1.0)):  # a tail drawn too often
        return False
    df = len(bins) - 1
    if df < 1:
        return True
    stat = sum((c - e) ** 2 / e for c, e in bins)
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / np.sqrt(2 / (9 * df))
    return bool(z <= REJECT_Z)


def draw_first(check: Part3Base, temperature: float, top_p: float) -> list[str]:
    """generate's first token for the probe's prompt at ``temperature`` and ``top_p``."""
    probe = check.meta()["sampling"]
    drawn: list[str] = []
    for seed in range(probe["calls"]):
        reply = check.generate(
            [probe["prompt"]] * probe["rows"], True, model="bench", max_gen_len=1,
            temperature=temperature, top_p=top_p, seed=seed, record_logits=False,
        )  # fmt: skip
        drawn += [t for t in check.texts(reply) if isinstance(t, str)]
    return drawn


def temperature_causes(
    check: Part3Base, logits: np.ndarray, texts: list[str], top_p_right: bool
) -> tuple[list[Cause], set[str]]:
    """The temperature and top-p varied alone in generate, on the submission's own logits
    (``logits``, the vocabulary's; ``texts``, each id's text): the causes they single out,
    and which of the library's names the temperature alone confirms."""
    temperature = float(check.meta()["sampling"]["temperature"])
    top_p = float(check.meta()["sampling"]["top_p"])
    try:
        no_cut = draw_first(check, temperature, 1.0)
        plain = draw_first(check, 1.0, top_p)
    except SubmissionError:
        return [], set()

    def dist(t: float, p: float) -> dict[str, float]:
        return text_distribution(nucleus_distribution(logits, t, p), texts)

    t_fits = [k for k, f in TEMPERATURES.items() if fits(no_cut, dist(f(temperature), 1.0))]
    p_right = fits(plain, dist(1.0, top_p))
    evidence = (
        f"generate's first token drawn {len(no_cut)} times at temperature={temperature}, "
        f"top_p=1 (no cut) and at temperature=1, top_p={top_p}, against your model's own "
        "logits"
    )
    if t_fits == ["divided"] and p_right:
        return [
            Cause(
                "isolated:temperature_and_top_p_combined_wrong",
                f"your generate follows softmax(logits / T) with top_p = 1, and the top-p "
                f"nucleus with T = 1, but not both at once (T = {temperature}, top_p = "
                f"{top_p}): the nucleus must be cut from softmax(logits / T), the temperature "
                "applied first",
                evidence,
            )
        ], set()
    causes: list[Cause] = []
    known: set[str] = set()
    if "divided" not in t_fits:
        if len(t_fits) == 1 and t_fits[0] in WORDS:
            text = f"your generate {WORDS[t_fits[0]]}"
            causes.append(Cause(f"isolated:temperature_{t_fits[0]}", text, evidence))
        elif len(t_fits) == 1:
            known.add(t_fits[0])  # the library's words (temperature_ignored, always_greedy)
        else:
            causes.append(
                Cause(
                    "isolated:temperature_wrong",
                    f"your generate's draws at temperature={temperature} with no top-p cut "
                    f"do not follow softmax(logits / {temperature}): the temperature is "
                    "applied wrong (divide the last position's logits by it, then softmax)",
                    evidence,
                )
            )
    if not p_right and "always_greedy" not in t_fits:  # T = 1: most temperature bugs agree
        where = (
            "sample_top_p is right on its own, so look at what generate hands it (top_p, "
            "the probabilities)"
            if top_p_right
            else "see sample_top_p's own probe"
        )
        causes.append(
            Cause(
                "isolated:generate_top_p_wrong",
                f"your generate's draws at temperature=1 with top_p={top_p} do not follow "
                f"the top-p nucleus of softmax(logits), while the temperature alone is right: "
                f"{where}",
                evidence,
            )
        )
    return causes, known


def top_p_sets(check: Part3Base) -> dict[float, list[list[int]]] | None:
    """sample_top_p's draws of :data:`ROW` at each p of :data:`PS` (None where it fails)."""
    out = {}
    for p in PS:
        header = {"op": "sample_top_p", "p": p, "draws": DRAWS}
        probs = np.array([ROW], dtype=np.float32)
        try:
            reply = check.ctx.worker(check.part).request(
                header, {"probs": probs}, what=f"sample_top_p(probs, {p})"
            )
        except SubmissionError:
            return None
        draws = reply.arrays.get("draws")
        if not isinstance(draws, np.ndarray) or draws.shape != (1, DRAWS):
            return None
        out[p] = draws.tolist()
    return out


def nucleus(row: tuple[float, ...], p: float, descending: bool = True) -> list[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i] if descending else row[i])
    kept, before = [], 0.0
    for i in order:
        if before > p:
            break
        kept.append(i)
        before += row[i]
    return kept


def top_p_causes(check: Part3Base) -> list[Cause]:
    """What sample_top_p's draws at several p show (see the module's docstring)."""
    drawn = top_p_sets(check)
    if drawn is None:
        return []
    seen = {p: sorted(set(d[0])) for p, d in drawn.items()}
    right = {p: sorted(nucleus(ROW, p)) for p in PS}
    said = "; ".join(f"p={p}: drew {seen[p]}, nucleus {right[p]}" for p in PS)
    evidence = f"sample_top_p on probabilities {list(ROW)}, {DRAWS} draws at each p: {said}"
    patterns = {
        "returns_ranks": {p: list(range(len(right[p]))) for p in PS},
        "sorted_ascending": {p: sorted(nucleus(ROW, p, descending=False)) for p in PS},
        "ignores_p": {p: list(range(len(ROW))) for p in PS},
    }
    words = {
        "returns_ranks": "returns the positions of the drawn tokens in the sorted order, not "
        "their ids: map them back with torch.gather(probs_idx, -1, choice)",
        "sorted_ascending": "sorts the probabilities in ascending order, so it keeps the "
        "least likely tokens: sort with descending=True",
        "ignores_p": "draws from every token whatever p is: zero the tokens whose preceding "
        "cumulative probability already exceeds p",
    }
    hits = [k for k, want in patterns.items() if seen == want and want != right]
    if len(hits) == 1:
        return [Cause(f"isolated:top_p_{hits[0]}", f"your sample_top_p {words[hits[0]]}", evidence)]
    if seen == right and not all(proportional(drawn[p][0], right[p]) for p in PS):
        return [
            Cause(
                "isolated:top_p_proportions_wrong",
                "your sample_top_p draws exactly the nucleus, but not in proportion to the "
                "probabilities: renormalise the kept probabilities and draw with "
                "torch.multinomial",
                evidence,
            )
        ]
    return []


def proportional(draws: list[int], kept: list[int]) -> bool:
    """Whether each kept token came up as often as its renormalised probability says."""
    total = sum(ROW[i] for i in kept)
    want: dict[Any, float] = {i: ROW[i] / total for i in kept}
    return fits(draws, want)
