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

import re
from dataclasses import dataclass, field

from grader.parts.part1.printed_values import (
    NON_FINITE,
    NUMBER,
    UNREADABLE,
    Number,
    finest,
    read_numbers,
)

#: The write-up's inputs, assumed where a line does not state its own.
DEFAULT_WHERE = {"tp": 1, "N": 1024, "d": 128, "batch": 1}
#: The keys whose figures depend on N and d (and, for intensities, the batch).
PHASE_KEYS = ("ai", "flops", "bytes")
#: The most digits an input in a label (TP degree, N, d, batch) may have; one with more
#: stands for no input (``TOO_LONG``) and its line is not read.
MAX_INPUT_DIGITS = 12
TOO_LONG = -1

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_HEADING = re.compile(r"^\s*(?:[-=#*~_]{3,}|#+\s)")
_INTENSITY = re.compile(r"intensity|\bai\b|flops?\s*/\s*byte|flops? per byte")
_TP = re.compile(r"(?:\btp\b|tensor[\s-]*parallel\w*|\bx\b)[^\d\n]{0,24}?(\d+)")
_TP_WORD = re.compile(r"\btp\b|tensor[\s-]*parallel")
_SINGLE = re.compile(r"\b(?:1|one|single)\s+gpu\b|\bno\s+tp\b|without\s+(?:tp|tensor)")
_N = re.compile(r"\bn\s*=\s*(\d[\d,]*)")
_D = re.compile(r"\bd\s*=\s*(\d+)")
_BATCH = re.compile(r"\b(?:batch(?:[\s_]*size)?|b)\s*[=:]?\s*(\d+)")


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
        return bool(re.search(r"[A-Za-z]", line)) and not NUMBER.search(line)
    return not NUMBER.search(split[1]) and not NON_FINITE.match(split[1])


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
    numbers = read_numbers(value, label, base)
    if isinstance(numbers, str):
        return key, at, numbers
    options = finest(numbers)
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
        best = finest([opts for opts, _ in found])
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
