"""Sealed answers: public Part 1 cases that check a student's value without holding it.

Every public Part 1 case asks for a figure the write-up asks students to derive:
the handout's LLaMA-3-8B and Llama-3.2-1B parameter counts, weight and KV-cache
bytes, the max batch sizes on one GPU and under tensor parallelism, the attention
FLOPs, bytes and intensities at N = 1024, d = 128, and the answer table.
``student.zip`` ships those cases for the self-check, so they hold no answer in
plain form. Nor do they hold the known mistakes' values in plain form: those give the
answer away too (the "forgotten factor 2" value is half of it).

How a value is sealed (``seal``) and a student's value checked against it
(``Verdict``):

* **Integers** must match exactly, so the seal is a digest of the canonical form
  ``int:<decimal>``.
* **Floats** match within the grader's relative tolerance ``rel_tol``, so a digest
  of the float itself would not do. The seal is a digest of ``x``'s place on a
  logarithmic grid: ``float:<sign>:<k>`` with ``k = floor(ln|x| / h)`` and
  ``h = -ln(1 - rel_tol)``, the widest log-distance that ``math.isclose(y, x,
  rel_tol=rel_tol)`` accepts. A student's ``y`` is accepted when its own index
  ``j`` or ``j - 1`` or ``j + 1`` has the stored digest. If ``y`` is within the
  tolerance, ``|ln y - ln x| <= h``, so ``|j - k| <= 1``: everything the grader
  accepts is accepted. Nothing further than ``2h`` (about twice the tolerance) is
  accepted, so a verdict can differ from the grader's only for a value between one
  and two tolerances away. Checking the neighbours also absorbs a last-bit
  difference of ``math.log`` between the machine that sealed the value and the
  student's. Zero (and anything within the grader's ``abs_tol`` of it) is
  ``float:0``.
* **Tables** (``answer_table``) are sealed entry by entry, so the feedback can
  still name the wrong entries.

The digest is PBKDF2-HMAC-SHA256 with ``ITERATIONS`` rounds and a salt per case,
per role (the expected value, or ``MISTAKE`` for every known mistake) and per table
entry. The salt stops one precomputed table from serving every case and stops equal
seals from showing which mistakes give the right value for an entry. The mistakes
share one salt so that a student's value is digested once (three times for a float)
however many mistakes and combinations of mistakes a case holds: equal seals then show
that two mistakes give the same value, which says nothing about the answer. The rounds
make each guess cost milliseconds. A float answer then takes a search over millions of grid
points (about 2.3 million per factor of ten, some four hours of one core), not a
lookup. Salts come from the case's id, so ``regen`` writes the same bytes every
time.

What this does not stop: the self-check itself says right or wrong for any value
a student tries, and no offline check can avoid that. An integer from a small
range, such as a batch size of a few hundred, can be found by trying each
candidate, which takes seconds. The seal keeps answers out of the zip's plain
text and out of reach of a grep or a glance. It does not turn the self-check
into a secret.

Why seal the floats instead of moving them to the hidden file and keeping other
public figures: the write-up's floats (the intensities at N = 1024, d = 128, the
table's GiB figures) are exactly what a student wants to check before submitting.
The grid seal keeps those checks in the self-check with the grader's tolerance.

On Gradescope nothing is judged from a seal: the hidden file carries every
sealed case's plain expected value and mistakes (its ``answers`` table, by case
id), and the checks compare with those exactly as before.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping
from typing import Any

from grader.judging.base import same_value, values_match

#: PBKDF2 rounds per digest: about 6 ms on a laptop core. A self-check of the solution
#: computes a few dozen digests, a wrong submission a few hundred.
ITERATIONS = 20_000
#: Values this close to zero are zero (the grader's ``abs_tol``).
ABS_TOL = 1e-12
_TAG = "kv-course/part1/seal/v1"
#: The role every known mistake (single or combined) is sealed under.
MISTAKE = "mistake"

Sealed = dict[str, Any]  # {"int": hex} | {"float": hex} | {"table": {key: {"int"|"float": hex}}}


def kind_of(value: Any) -> str:
    """A value's kind as the case file's ``want`` names it: "int", "float" or "table"."""
    if isinstance(value, dict):
        return "table"
    return "int" if isinstance(value, int) and not isinstance(value, bool) else "float"


def grid_step(rel_tol: float) -> float:
    """The grid's step in ``ln|x|``: the widest log-distance ``math.isclose`` accepts."""
    return -math.log1p(-rel_tol)


def float_forms(value: float, rel_tol: float) -> list[str]:
    """Canonical forms of ``value``'s grid point and its two neighbours (its own first)."""
    if abs(value) <= ABS_TOL:
        return ["float:0"]
    sign = "-" if value < 0 else "+"
    k = math.floor(math.log(abs(value)) / grid_step(rel_tol))
    return [f"float:{sign}:{i}" for i in (k, k - 1, k + 1)]


@functools.lru_cache(maxsize=4096)
def digest(form: str, salt: str) -> str:
    """The stretched, salted digest of one canonical form."""
    key = hashlib.pbkdf2_hmac("sha256", form.encode(), salt.encode(), ITERATIONS)
    return key.hex()


def salt(case_id: str, role: str, entry: str = "") -> str:
    """The salt of one sealed value: the case, the role ("expected" or a mistake's name)
    and, in a table, the entry."""
    return hashlib.sha256(f"{_TAG}|{case_id}|{role}|{entry}".encode()).hexdigest()[:32]


def _seal_scalar(value: int | float, salt_: str, rel_tol: float) -> dict[str, str]:
    if kind_of(value) == "int":
        return {"int": digest(f"int:{int(value)}", salt_)}
    return {"float": digest(float_forms(float(value), rel_tol)[0], salt_)}


def seal(value: Any, case_id: str, role: str, rel_tol: float) -> Sealed:
    """``value`` (an int, a float or a table of them) as it is stored in a public case."""
    if isinstance(value, dict):
        return {
            "table": {k: _seal_scalar(v, salt(case_id, role, k), rel_tol) for k, v in value.items()}
        }
    return _seal_scalar(value, salt(case_id, role), rel_tol)


class _Probe:
    """A student's scalar digested under one salt, each kind once, to test against many
    seals made with that salt (every mistake of a case, or of one table entry)."""

    def __init__(self, got: Any, salt_: str, rel_tol: float):
        self.got, self.salt, self.rel_tol = got, salt_, rel_tol
        self.digests: dict[str, set[str]] = {}

    def _of(self, kind: str) -> set[str]:
        got = self.got
        if kind not in self.digests:
            forms: list[str] = []
            if isinstance(got, bool) or not isinstance(got, int | float):
                pass
            elif kind == "int":
                forms = [f"int:{got}"] if isinstance(got, int) else []
            elif math.isfinite(got):
                forms = float_forms(float(got), self.rel_tol)
            self.digests[kind] = {digest(f, self.salt) for f in forms}
        return self.digests[kind]

    def matches(self, sealed: Mapping[str, str]) -> bool:
        """Whether the probed value is the sealed scalar."""
        ((kind, hexdigest),) = sealed.items()
        return hexdigest in self._of(kind)


def _scalar_matches(got: Any, sealed: Mapping[str, str], salt_: str, rel_tol: float) -> bool:
    if isinstance(got, bool) or not isinstance(got, int | float):
        return False
    if "int" in sealed:
        return isinstance(got, int) and digest(f"int:{got}", salt_) == sealed["int"]
    if not math.isfinite(got):
        return False
    return any(digest(f, salt_) == sealed["float"] for f in float_forms(float(got), rel_tol))


def matches(got: Any, sealed: Sealed, case_id: str, role: str, rel_tol: float) -> bool:
    """Whether ``got`` is the sealed value (for a table: every entry, same keys)."""
    if "table" in sealed:
        table = sealed["table"]
        return (
            isinstance(got, dict)
            and got.keys() == table.keys()
            and all(
                _scalar_matches(got[k], s, salt(case_id, role, k), rel_tol)
                for k, s in table.items()
            )
        )
    return _scalar_matches(got, sealed, salt(case_id, role), rel_tol)


class Verdict:
    """One case's expected value and known mistakes, judged plain or through the seals.

    ``answer`` is ``{"expected": ..., "mistakes": ...}`` in plain form (a hidden or
    unsealed case, or a sealed one whose answer the hidden file holds), or ``None``
    when only the case's seals are at hand (the student's self-check).
    """

    def __init__(self, case: Mapping[str, Any], answer: Mapping[str, Any] | None, rel_tol: float):
        self.case = case
        self.answer = answer
        self.rel_tol = rel_tol

    def kinds(self) -> str | dict[str, str]:
        """The expected value's kind, or a table's kind per entry."""
        if self.answer is not None:
            expected = self.answer["expected"]
            if isinstance(expected, dict):
                return {k: kind_of(v) for k, v in expected.items()}
            return kind_of(expected)
        sealed = self.case["sealed"]["expected"]
        if "table" in sealed:
            return {k: next(iter(s)) for k, s in sealed["table"].items()}
        return next(iter(sealed))

    def right(self, got: Any) -> bool:
        """Whether ``got`` is the expected value (within the tolerance for floats)."""
        if self.answer is not None:
            return same_value(got, self.answer["expected"], self.rel_tol)
        return matches(
            got, self.case["sealed"]["expected"], self.case["id"], "expected", self.rel_tol
        )

    def wrong_entries(self, got: Mapping[str, Any]) -> list[str]:
        """The entries of a returned table that are wrong, in the expected table's order."""
        if self.answer is not None:
            expected = self.answer["expected"]
            return [k for k in expected if not values_match(got[k], expected[k], self.rel_tol)]
        table = self.case["sealed"]["expected"]["table"]
        case_id = self.case["id"]
        return [
            k
            for k, s in table.items()
            if not _scalar_matches(got[k], s, salt(case_id, "expected", k), self.rel_tol)
        ]

    def mistakes(self, got: Any) -> list[str]:
        """The known mistakes (single or combined) whose whole value ``got`` equals."""
        if self.answer is not None:
            return [
                name
                for name, value in self.answer.get("mistakes", {}).items()
                if same_value(got, value, self.rel_tol)
            ]
        sealed = self.case["sealed"]["mistakes"]
        if not isinstance(got, dict):
            probe = _Probe(got, salt(self.case["id"], MISTAKE), self.rel_tol)
            return [n for n, s in sealed.items() if "table" not in s and probe.matches(s)]
        probes = {k: self._entry_probe(got, k) for k in got}
        return [
            name
            for name, s in sealed.items()
            if "table" in s
            and s["table"].keys() == got.keys()
            and all(probes[k].matches(e) for k, e in s["table"].items())
        ]

    def entry_mistakes(self, got: Mapping[str, Any], key: str) -> list[str]:
        """The known mistakes whose table has ``got[key]`` at entry ``key``: a table is
        judged entry by entry too, as one slip (GB for GiB in two cells) shows in some
        entries of a table that is otherwise right or wrong for other reasons."""
        if self.answer is not None:
            return [
                name
                for name, value in self.answer.get("mistakes", {}).items()
                if isinstance(value, dict)
                and key in value
                and values_match(got[key], value[key], self.rel_tol)
            ]
        probe = self._entry_probe(got, key)
        return [
            name
            for name, s in self.case["sealed"]["mistakes"].items()
            if key in s.get("table", {}) and probe.matches(s["table"][key])
        ]

    def _entry_probe(self, got: Mapping[str, Any], key: str) -> _Probe:
        return _Probe(got[key], salt(self.case["id"], MISTAKE, key), self.rel_tol)
