"""Part 1 answers read from what a course-style script prints: text in, labelled numbers out.

The course asks for Part 1 as "a script (in any language of your choice)" that prints a
table: total parameters, weight memory, KV cache per request, the max batch size on one
GPU and under tensor parallelism, and the arithmetic intensities. Such a script defines
none of the kit's functions, so :mod:`grader.parts.part1.script` grades it from its
output, as a TA reads it. This module only reads: it runs in the trusted parent on text
the submission printed, and never executes anything.

Each line with a label and a value becomes a :class:`Reading`: which answer (``key``),
for which inputs (``where``: the TP degree of a batch size; N, d and batch of an
attention figure, the write-up's values when the line does not say), and the number in
base units (parameters, bytes, FLOPs, requests, FLOPs/byte) with the resolution it was
printed to, so a rounded "12.34 GiB" is compared within its last digit. Accepted forms:
``Label: value``, ``Label = value``, columns split by tabs, two spaces or ``|``,
thousands separators, scientific notation, ``1.23B`` / ``1.23 billion``, byte units.
"GB" is read both ways, as 10^9 bytes and (as the course's write-up uses it) as 2^30:
a :class:`Reading` then has two ``options``. Headings (decorated lines, lines ending in
a colon) give context to the lines below them: "For Tensor Parallelism X = 2:" makes the
next batch size a TP = 2 one. A line the grader cannot read (a byte figure with a
fraction and no unit, a value that is not a number) is kept as unreadable, not guessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

#: The write-up's inputs, assumed where a line does not state its own.
DEFAULT_WHERE = {"tp": 1, "N": 1024, "d": 128, "batch": 1}
#: The keys whose figures depend on N and d (and, for intensities, the batch).
PHASE_KEYS = ("ai", "flops", "bytes")
#: The most digits an input in a label (TP degree, N, d, batch) or an exponent may have;
#: one with more stands for no input (``TOO_LONG``) and its line is not read.
MAX_INPUT_DIGITS = 12
MAX_EXPONENT_DIGITS = 4
TOO_LONG = -1
UNREADABLE = "is not a number we can read"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMBER = re.compile(
    r"(?<![\w.])(?P<num>[-+]?(?:\d{1,3}(?:[,_\u2009\u202f]\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+)"
    r"(?:[eE](?P<exp>[-+]?\d+)|\s*[x×*]\s*10\s*(?:\^|\*\*)\s*(?P<exp2>[-+]?\d+))?"
    r"(?:\s*(?P<unit>[A-Za-z]+(?:/[A-Za-z]+)?))?"
)
#: What Python and NumPy print for a value that is no finite number: a labelled answer,
#: not a heading, that cannot be read.
_NON_FINITE = re.compile(r"[-+]?(?:nan|inf(?:inity)?)\b", re.IGNORECASE)
_HEADING = re.compile(r"^\s*(?:[-=#*~_]{3,}|#+\s)")
_INTENSITY = re.compile(r"intensity|\bai\b|flops?\s*/\s*byte|flops? per byte")
_TP = re.compile(r"(?:\btp\b|tensor[\s-]*parallel\w*|\bx\b)[^\d\n]{0,24}?(\d+)")
_TP_WORD = re.compile(r"\btp\b|tensor[\s-]*parallel")
_SINGLE = re.compile(r"\b(?:1|one|single)\s+gpu\b|\bno\s+tp\b|without\s+(?:tp|tensor)")
_N = re.compile(r"\bn\s*=\s*(\d[\d,]*)")
_D = re.compile(r"\bd\s*=\s*(\d+)")
_BATCH = re.compile(r"\b(?:batch(?:[\s_]*size)?|b)\s*[=:]?\s*(\d+)")
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


@dataclass(frozen=True)
class Reading:
    """One answer read from one line: the first option reads "GB" as 2^30 bytes, the second
    (present only for KB/MB/GB/TB) as 10^9."""

    key: str
    where: tuple[tuple[str, int], ...]
    options: tuple[Number, ...]
    line: str


@dataclass(frozen=True)
class Unreadable:
    """A line labelled as an answer whose value could not be read, and why."""

    key: str
    where: tuple[tuple[str, int], ...]
    line: str
    why: str


@dataclass
class PrintedAnswers:
    """Everything read from one output."""

    readings: list[Reading] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)

    def find(self, key: str, where: dict[str, int]) -> list[Reading | Unreadable]:
        """Every reading (or unreadable line) of ``key`` for exactly these inputs."""
        want = tuple(sorted(where.items()))
        return [r for r in [*self.readings, *self.unreadable] if r.key == key and r.where == want]


# ---------------------------------------------------------------------------- labels


def classify(label: str, phase: str | None) -> str | None:
    """Which answer a label names: "params", "weight_bytes", "kv_bytes", "max_batch", or
    "ai" / "flops" / "bytes" of an attention phase; None for any other line."""
    low = label.lower()
    if _INTENSITY.search(low):
        return "ai"
    if "flop" in low:
        return "flops"
    moved = ("access", "traffic", "hbm", "moved", "transferred", "read", "i/o")
    if phase and any(w in low for w in (*moved, "byte", "memory")) and "kv" not in low:
        return "bytes"
    if "batch" in low and any(w in low for w in ("max", "possible", "fit", "largest", "b_max")):
        return "max_batch"
    if "kv" in low or "cache" in low:
        skip = ("per token", "per layer", "per gpu", "batch", "all requests", "total kv")
        return None if any(w in low for w in skip) else "kv_bytes"
    memory = ("memory", "byte", "size", "gb", "gib", "mb", "weight", "footprint")
    if "param" in low and not any(w in low for w in memory):
        return "params"
    skip = ("gpu", "available", "free", "remaining", "left", "budget", "hbm", "bandwidth")
    if any(w in low for w in memory) and not any(w in low for w in skip):
        return "weight_bytes"
    return None


def _phase(text: str) -> str | None:
    low = text.lower()
    if "prefill" in low or "prompt" in low:
        return "prefill"
    if "decod" in low or "generation" in low:
        return "decode"
    return None


def _whole(digits: str) -> int:
    """An input a label states (a TP degree, N, d, a batch), as an int; :data:`TOO_LONG`
    past :data:`MAX_INPUT_DIGITS` digits (Python refuses to read an int of thousands of
    digits, and no input of the write-up has more than a few)."""
    digits = digits.replace(",", "")
    return int(digits) if len(digits) <= MAX_INPUT_DIGITS else TOO_LONG


def _tp(text: str) -> int | None:
    """The TP degree a text states (1 for "one GPU", "no TP"), None if it states none."""
    low = text.lower()
    if _SINGLE.search(low):
        return 1
    found = _TP.search(low)
    return _whole(found.group(1)) if found else None


def _int(pattern: re.Pattern[str], text: str) -> int | None:
    found = pattern.search(text.lower())
    return _whole(found.group(1)) if found else None


def _where(key: str, label: str, context: dict[str, int | str]) -> dict[str, int] | str:
    """The inputs a line's answer is for: the label's, else its heading's, else the
    write-up's. A string says why it cannot be told (a TP batch size without a degree)."""
    if key == "max_batch":
        tp = _tp(label)
        if tp == TOO_LONG:
            return f"its TP degree {UNREADABLE}"
        if tp is None and _TP_WORD.search(label.lower()):
            tp = context.get("tp") or None  # "with TP": the heading's degree, if any
            if tp is None:
                return "it names tensor parallelism without its degree X"
        return {"tp": int(tp if tp is not None else context.get("tp", 1))}
    if key not in PHASE_KEYS:
        return {}
    where = {
        name: _int(pattern, label) or context.get(name) or DEFAULT_WHERE[name]
        for name, pattern in (("N", _N), ("d", _D))
    }
    if key == "ai":
        where["batch"] = _int(_BATCH, label) or context.get("batch") or 1
    long = [name for name, value in where.items() if value == TOO_LONG]
    if long:
        return f"its {long[0]} {UNREADABLE}"
    return {k: int(v) for k, v in where.items()}


def _context(heading: str) -> dict[str, int | str]:
    """What a heading says about the lines below it."""
    out: dict[str, int | str] = {}
    for name, value in (
        ("tp", _tp(heading)),
        ("phase", _phase(heading)),
        ("N", _int(_N, heading)),
        ("d", _int(_D, heading)),
        ("batch", _int(_BATCH, heading)),
    ):
        if value is not None and value != TOO_LONG:
            out[name] = value
    return out


# ---------------------------------------------------------------------------- values


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


def _numbers(value: str, label: str, key: str) -> list[tuple[Number, ...]] | str:
    """The value's numbers as options in base units: the first number, and any later one
    that carries a unit ("1,234,567,890 (1.23 B)"). A string says why none can be read."""
    family = _family(key)
    found = []
    for i, match in enumerate(_NUMBER.finditer(value)):
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
        infinite = _NON_FINITE.match(value)
        if infinite:
            return f"{infinite.group(0)!r} {UNREADABLE} (not a finite number)"
        return "no number could be read from it"
    return found


def _value(digits: str, exp: str) -> tuple[float, float] | None:
    """A printed number and its resolution (the value of its last digit), both finite;
    None for one that is not (``1e400``, 400 digits, an exponent of 5,000 digits: Python
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


def _agree(x: Number, y: Number) -> bool:
    """Whether two printed numbers can be the same quantity (their roundings overlap)."""
    return abs(x.value - y.value) < (x.step + y.step) / 2 or x.value == y.value


def _finest(options: list[tuple[Number, ...]]) -> tuple[Number, ...] | None:
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
            if all(any(_agree(x, y) for y in other) for j, other in enumerate(options) if j != i)
        )
        for i, opts in enumerate(options)
    ]
    if not all(kept):
        return None
    return min(kept, key=lambda opts: min(n.step / max(abs(n.value), 1e-300) for n in opts))


# ----------------------------------------------------------------------------- lines


def split_line(line: str) -> tuple[str, str] | None:
    """A line as (label, value text); None for a line that is no labelled value."""
    text = line.strip()
    if "|" in text:
        cells = [c.strip() for c in text.strip("|").split("|")]
        cells = [c for c in cells if c]
        if len(cells) < 2 or all(re.fullmatch(r"[-:= ]*", c) for c in cells):
            return None
        return cells[0], " ".join(cells[1:])
    for pattern in (r"\t+", r":\s+|:$", r"\s{2,}"):
        parts = re.split(pattern, text, maxsplit=1)
        if len(parts) == 2 and parts[0].strip():
            return parts[0].strip(), parts[1].strip()
    value = r"([-+]?\.?\d[\d.,_eE+\-]*(?:\s*[A-Za-z]+(?:/[A-Za-z]+)?)?)"
    for pattern in (rf"^(.*\S)\s*=\s*{value}$", rf"^(.*[A-Za-z)\]])\s+{value}$"):
        found = re.match(pattern, text)
        if found:
            return found.group(1).strip(), found.group(2).strip()
    return None


def _is_heading(line: str, split: tuple[str, str] | None) -> bool:
    if _HEADING.match(line):
        return True
    if split is None:
        return bool(re.search(r"[A-Za-z]", line)) and not _NUMBER.search(line)
    return not _NUMBER.search(split[1]) and not _NON_FINITE.match(split[1])


def _read_line(
    line: str, split: tuple[str, str], context: dict[str, int | str]
) -> tuple[str, tuple, tuple[Number, ...] | str] | None:
    """One answer line as (key, inputs, options or why it cannot be read); None for a line
    that is no answer."""
    label, value = split
    phase = _phase(label) or context.get("phase")
    base = classify(label, phase if isinstance(phase, str) else None)
    if base is None or re.fullmatch(r"[-+\d.,\s]+", label):
        return None  # not an answer, or a row of numbers (a sweep)
    if base in ("weight_bytes", "kv_bytes") and int(context.get("tp", 1)) > 1:
        return None  # a per-GPU share under a tensor-parallel heading
    if base in PHASE_KEYS and phase is None:
        return None  # an intensity of no stated phase (a limit, a comment)
    key = f"{base}_{phase}" if base in PHASE_KEYS else base
    where = _where(base, label, context)
    if isinstance(where, str):
        return key, (), where
    at = tuple(sorted(where.items()))
    numbers = _numbers(value, label, base)
    if isinstance(numbers, str):
        return key, at, numbers
    options = _finest(numbers)
    return key, at, options if options is not None else "its numbers disagree"


def read_answers(text: str) -> PrintedAnswers:
    """Every labelled answer of a script's output (see the module docstring). The same
    answer printed twice must agree; two different values make it unreadable."""
    answers = PrintedAnswers()
    context: dict[str, int | str] = {}
    grouped: dict[tuple[str, tuple], list[tuple[tuple[Number, ...], str]]] = {}
    for raw in _ANSI.sub("", text).replace("\u2502", "|").replace("\u2503", "|").splitlines():
        line = raw.strip()
        if not re.search(r"[A-Za-z0-9]", line):
            continue
        split = split_line(line)
        if _is_heading(line, split):
            context = _context(line)
            continue
        if split is None:
            continue
        read = _read_line(line, split, context)
        if read is None:
            continue
        key, at, options = read
        if isinstance(options, str):
            answers.unreadable.append(Unreadable(key, at, line, options))
        else:
            grouped.setdefault((key, at), []).append((options, line))
    for (key, at), found in grouped.items():
        best = _finest([opts for opts, _ in found])
        if best is None:
            lines = "; ".join(repr(line) for _, line in found[:3])
            answers.unreadable.append(
                Unreadable(key, at, lines, "it is printed with different values")
            )
            continue
        texts = {n.text for n in best}
        line = next((line for opts, line in found if {n.text for n in opts} & texts), found[0][1])
        answers.readings.append(Reading(key, at, best, line))
    return answers
