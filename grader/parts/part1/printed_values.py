"""Printed numbers read as values: a number's text, with its unit, in base units and with
the resolution its digits give (:class:`Number`), for :mod:`grader.parts.part1.printed`.

Only finite numbers a float holds are values: ``1e400``, a number of thousands of digits,
an exponent of thousands of digits (Python refuses to read such an int), ``nan`` and
``inf`` make their line "not a number we can read", with the text that is not, never an
exception in the grader.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: The most digits an exponent may have (a float's is at most 3).
MAX_EXPONENT_DIGITS = 4
UNREADABLE = "is not a number we can read"

NUMBER = re.compile(
    r"(?<![\w.])(?P<num>[-+]?(?:\d{1,3}(?:[,_\u2009\u202f]\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d+)|\s*[x×*]\s*10\s*(?:\^|\*\*)\s*(?P<exp2>[-+]?\d+))?"
    r"(?:\s*(?P<unit>[A-Za-z]+(?:/[A-Za-z]+)?))?"
)
#: What Python and NumPy print for a value that is no finite number: a labelled answer,
#: not a heading, that cannot be read.
NON_FINITE = re.compile(r"[-+]?(?:nan|inf(?:inity)?)\b", re.IGNORECASE)
_LABEL_UNIT = re.compile(r"\((?:in\s+)?([a-z]+)\)|\bin\s+([a-z]+)\b")

_COUNT_UNITS = {"b": 1e9, "bn": 1e9, "billion": 1e9, "billions": 1e9, "m": 1e6, "mn": 1e6,
                "million": 1e6, "millions": 1e6, "k": 1e3, "thousand": 1e3, "t": 1e12,
                "trillion": 1e12}  # fmt: skip
_BYTE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30,
               "tib": 2**40}  # fmt: skip
_DECIMAL_BYTES = {"kb": 1, "mb": 2, "gb": 3, "tb": 4}  # 10^(3i) or, as the course writes, 2^(10i)
_FLOP_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


@dataclass(frozen=True)
class Number:
    """A printed number in base units, with the resolution its digits give (``step``)."""

    value: float
    step: float
    text: str

    def exact_int(self) -> int | None:
        """The integer it states exactly (every digit printed), else None."""
        if self.step <= 1 and math.isfinite(self.value) and self.value == round(self.value):
            return round(self.value)
        return None

    def precise(self, kind: str, rel_tol: float) -> bool:
        """Printed finely enough to be compared as a value: ints in full, floats within
        the grader's tolerance."""
        if kind == "int":
            return self.exact_int() is not None
        return self.step / 2 <= rel_tol * abs(self.value)

    def contains(self, x: float, rel_tol: float) -> bool:
        """Whether ``x`` rounds to what was printed (within the tolerance too)."""
        exact = self.exact_int()
        if exact is not None and isinstance(x, int) and self.step <= 1:
            return exact == x
        return abs(x - self.value) <= self.step / 2 + rel_tol * abs(x) + 1e-12

    def scaled(self, factor: float) -> Number:
        return Number(self.value * factor, self.step * factor, self.text)


def _family(key: str) -> str:
    """How a key's units are read: "count", "bytes", "flops" or "plain"."""
    if key == "params":
        return "count"
    if key in ("weight_bytes", "kv_bytes", "bytes"):
        return "bytes"
    return "flops" if key == "flops" else "plain"


def _multipliers(unit: str, family: str) -> tuple[float, ...] | None:
    """The factors a unit word stands for in ``family`` (two for KB/MB/GB/TB: binary, then
    decimal); ``()`` for a word that is no unit of the family; None for no word."""
    if not unit:
        return None
    low = unit.lower()
    if family == "count":
        return (_COUNT_UNITS[low],) if low in _COUNT_UNITS else ()
    if family == "bytes":
        if low in _BYTE_UNITS:
            return (float(_BYTE_UNITS[low]),)
        if low in _DECIMAL_BYTES:
            i = _DECIMAL_BYTES[low]
            return (float(2 ** (10 * i)), float(10 ** (3 * i)))
        return ()
    if family == "flops":
        found = re.fullmatch(r"([kmgtp]?)flops?(?:/s)?", low)
        if found:
            return (_FLOP_PREFIX[found.group(1)],)
        return (_COUNT_UNITS[low],) if low in _COUNT_UNITS else ()
    return ()


def _label_unit(label: str, family: str) -> tuple[float, ...] | None:
    """A unit the label gives its values: "(GB)", "(in bytes)", "in billions"."""
    for found in _LABEL_UNIT.finditer(label.lower()):
        factors = _multipliers(found.group(1) or found.group(2), family)
        if factors:
            return factors
    return None


def read_numbers(value: str, label: str, key: str) -> list[tuple[Number, ...]] | str:
    """The value's numbers as options in base units: the first number, and any later one
    that carries a unit ("1,234,567,890 (1.23 B)"). A string says why none can be read."""
    family = _family(key)
    found = []
    for i, match in enumerate(NUMBER.finditer(value)):
        raw, unit = match.group("num"), match.group("unit") or ""
        factors = _multipliers(unit, family)
        if i > 0 and not factors:
            continue
        if factors is None or factors == ():
            factors = _label_unit(label, family)
        digits = re.sub(r"[,_\u2009\u202f]", "", raw)
        exp = match.group("exp") or match.group("exp2") or "0"
        text = match.group(0).strip()
        read = _value(digits, exp)
        if read is None:
            return f"{text[:40]!r} {UNREADABLE} (too large, or too many digits)"
        number, step = read
        if factors is None:
            decimals = len(digits.split(".")[1]) if "." in digits else 0
            if family == "bytes" and (decimals or int(exp) < 0):  # read: 4 digits at most
                return f"{text!r} has no unit (bytes, GiB, GB, ...)"
            factors = (1.0,)
        options = tuple(Number(number * f, step * f, text) for f in factors)
        if not all(math.isfinite(n.value) and math.isfinite(n.step) for n in options):
            return f"{text[:40]!r} {UNREADABLE} (too large in its unit)"
        found.append(options)
    if not found:
        infinite = NON_FINITE.match(value)
        if infinite:
            return f"{infinite.group(0)!r} {UNREADABLE} (not a finite number)"
        return "no number could be read from it"
    return found


def _value(digits: str, exp: str) -> tuple[float, float] | None:
    """A printed number and its resolution (the value of its last digit), both finite;
    None for one that is not (``1e400``, 400 digits, an exponent of thousands of digits: Python
    would overflow, or refuse to read such an int)."""
    if len(exp.lstrip("+-")) > MAX_EXPONENT_DIGITS:
        return None
    power = int(exp) - (len(digits.split(".")[1]) if "." in digits else 0)
    try:
        number, step = float(digits) * 10.0 ** int(exp), 10.0**power
    except OverflowError:
        return None
    if not (math.isfinite(number) and math.isfinite(step)):
        return None
    return number, step


def agree(x: Number, y: Number) -> bool:
    """Whether two printed numbers can be the same quantity (their roundings overlap)."""
    return abs(x.value - y.value) < (x.step + y.step) / 2 or x.value == y.value


def finest(options: list[tuple[Number, ...]]) -> tuple[Number, ...] | None:
    """One value printed several ways ("1,234,567,890 (1.23 B)", or on two lines): the
    most precise, keeping only the readings of "GB" that agree with every other; None
    when the values disagree. An option printed again (the same values at the same
    resolutions) decides nothing new and is compared once: a script that prints one line
    thousands of times costs what it costs once, not the square of it."""
    unique: dict[tuple[tuple[float, float], ...], tuple[Number, ...]] = {}
    for opts in options:  # the first of each kept, in order
        unique.setdefault(tuple((n.value, n.step) for n in opts), opts)
    options = list(unique.values())
    kept = [
        tuple(
            x
            for x in opts
            if all(any(agree(x, y) for y in other) for j, other in enumerate(options) if j != i)
        )
        for i, opts in enumerate(options)
    ]
    if not all(kept):
        return None
    return min(kept, key=lambda opts: min(n.step / max(abs(n.value), 1e-300) for n in opts))
