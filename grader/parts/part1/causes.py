"""Part 1's known mistakes as data: single mistakes, their combinations, and the
sentence that names them.

The mutant library (``grader/ta/mutants/part1.toml``) declares single mistakes, each
with a diagnosis. ``regen`` also stores, per case, the value of every compatible
combination of the mistakes that change it, under the names of its parts joined by
``+`` (``"no_output_head+two_matrix_ffn"``): real students make several of them at
once, and a value that equals no single mistake then still gets its causes named. The
catalogue (``diagnoses``) holds single mistakes only; a combination is named by the
diagnoses of its parts, and every part's id is recorded for reports.

Some mistakes nobody listed give a known mistake's value on some inputs (:data:`TWINS`):
the isolating experiments (:mod:`grader.parts.part1.probe`) decide between them, and
where the deciding experiment gives no answer both are named, with the fact that would
tell them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: JOIN joins the names of a combination's parts into the name it is stored under (and
#: a cause's id where it names them at once).
from grader.core.feedback_items import JOIN, Cause

#: The cause of a value that is the write-up's answer for another input.
HARD_CODED = "hard_coded_answer"


def parts_of(name: str) -> frozenset[str]:
    """The single mistakes a stored mistake's name stands for."""
    return frozenset(name.split(JOIN))


def combination(names: Iterable[str]) -> str:
    """The name a combination of single mistakes is stored under (sorted: one name per
    set, whatever order it was made in)."""
    return JOIN.join(sorted(names))


def minimal(names: Sequence[str]) -> list[str]:
    """``names`` without those whose parts include every part of another one: where one
    mistake explains a value, that mistake plus another is not a likelier cause."""
    sets = [parts_of(n) for n in names]
    return [n for n, s in zip(names, sets, strict=True) if not any(o < s for o in sets)]


def explanation(parts: Iterable[str], diagnoses: Mapping[str, str]) -> str:
    """What the code does, for one set of mistakes: "X, and Y, and Z" (by name, as the
    combination is stored)."""
    return ", and ".join(diagnoses[p] for p in sorted(parts))


def known(name: str, diagnoses: Mapping[str, str]) -> bool:
    """Whether every part of ``name`` has a diagnosis in the catalogue."""
    return all(p in diagnoses for p in parts_of(name))


def name_causes(names: Sequence[str], diagnoses: Mapping[str, str], of: str = "") -> list[Cause]:
    """The causes "your code X, and Y" of the stored mistakes ``names`` (single or
    combined; none if none is known), with ``of`` naming what each explains where that is
    not the whole value. A combination's id is its parts' ids joined by :data:`JOIN`."""
    chosen = minimal([n for n in dict.fromkeys(names) if known(n, diagnoses)])
    where = f" (in {of})" if of else ""
    evidence = "the wrong value equals this mistake's"
    return [
        Cause(combination(parts_of(n)), f"your code {explanation(parts_of(n), diagnoses)}{where}",
              evidence)
        for n in chosen
    ]  # fmt: skip


def cover(explained: Mapping[str, Sequence[str]]) -> frozenset[str]:
    """One small set of single mistakes that explains every entry of ``explained``
    (entry -> the stored mistakes that give the student's value there): the entries with
    the fewest explanations choose first, each taking the explanation that adds the
    fewest new mistakes."""
    chosen: frozenset[str] = frozenset()
    for _, names in sorted(explained.items(), key=lambda item: len(item[1])):
        options = [parts_of(n) for n in minimal(list(names))]
        if options and not any(o <= chosen for o in options):
            chosen |= min(options, key=lambda o: len(o - chosen))
    return chosen


def hard_coded_cause(label: str) -> list[Cause]:
    """The cause of a value that is right for the write-up's input ``label`` and was
    returned for another input (:data:`HARD_CODED`)."""
    text = (
        f"your code returns the answer for {label} for other inputs as well: compute it "
        "from the arguments instead of writing it in"
    )
    return [Cause(HARD_CODED, text, f"the value is the answer for {label}")]


@dataclass(frozen=True)
class Twin:
    """A mistake nobody listed that gives a known mistake's value on some inputs: the
    known mistake, the argument whose experiment tells them apart, when the two coincide
    (on the call's parameters), and the sentence that names the other candidate with the
    fact that decides."""

    known: str
    arg: str
    coincide: Callable[[Mapping[str, Any]], bool]
    text: str


def _bytes_per_param(params: Mapping[str, Any]) -> int:
    return params["spec"]["__spec__"].get("bytes_per_param", 2)


TWINS = (
    Twin(
        "kv_missing_factor_2",
        "bytes_per_elem",
        lambda p: p.get("bytes_per_elem") == 2 * _bytes_per_param(p),
        "your kv_cache_bytes_per_request sizes the cache at the weights' precision "
        "(spec.bytes_per_param) whatever bytes_per_elem says, which gives the same value "
        "here: if your value doubles when bytes_per_elem doubles, it is the factor 2; if it "
        "stays the same, it is the precision",
    ),
    Twin(
        "tp_cache_not_split",
        "tp",
        lambda p: p.get("tp", 1) > 1,
        "your max_batch_size ignores tp, which can give the same value here: if your batch "
        "grows with tp, it is the split; if it stays the same, tp is ignored",
    ),
)


def twin_candidates(
    known: Sequence[Cause], params: Mapping[str, Any], decided: Iterable[str]
) -> list[Cause]:
    """The other candidates of the ``known`` causes for a call with ``params``: each twin
    whose values coincide there and whose deciding argument's experiment gave no answer
    (``decided``: the arguments whose experiments did), named beside the known cause."""
    ids, done = {c.id for c in known}, set(decided)
    return [
        Cause(f"isolated:candidate_ignores_{t.arg}", t.text, f"{t.arg} could not be varied")
        for t in TWINS
        if t.known in ids and t.arg not in done and t.coincide(params)
    ]
