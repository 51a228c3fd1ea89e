"""The plan of benchmarks/gpu_parts.sh: which submission and which checks each named
grading is.

    python benchmarks/gpu_plan.py NAME... > plan.txt

One line per name: ``name submission parts tags`` (``-`` for none), the submission a
temporary copy of the solution with the named cache-free design applied (the reference
is ``solution`` itself). A name is ``WHO_WHAT``:

* WHO: ``reference`` (the solution), ``cache_free`` (each part's disguised cache-free
  mistake, calibrate's main baseline) or ``closer`` (calibrate's extra baseline of a part,
  a cache-free design that comes closer to the reference; with ``all``, the part's main
  baseline where it has no extra one, as ``verdict_stability.py --extra-baselines``);
* WHAT: ``partN`` (that part's benchmark check) or ``all`` (the reference: its whole
  grading; the others: every benchmark check).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.ta.calibrate import (  # noqa: E402
    BENCHMARK_PARTS,
    EXTRA_BASELINES,
    cache_free_submission,
    closer_designs,
)

WHO = ("reference", "cache_free", "closer")


def parse(name: str) -> tuple[str, list[str]]:
    """``name``'s WHO and the benchmark parts it grades; ValueError for a name that is not
    a plan's."""
    who, _, what = name.rpartition("_")
    if who not in WHO:
        raise ValueError(f"{name}: WHO must be one of {', '.join(WHO)}")
    if what != "all" and what not in BENCHMARK_PARTS:
        raise ValueError(f"{name}: WHAT must be all or one of {', '.join(BENCHMARK_PARTS)}")
    if who == "closer" and what not in ("all", *EXTRA_BASELINES):
        raise ValueError(f"{name}: {what} has no closer design (EXTRA_BASELINES)")
    return who, list(BENCHMARK_PARTS) if what == "all" else [what]


def designs(who: str, parts: list[str]) -> dict[str, str] | None:
    """The baseline mutant per part for ``cache_free_submission`` (None: the defaults)."""
    return closer_designs(parts) if who == "closer" else None


def line(name: str) -> str:
    """``name``'s plan line, its submission materialised."""
    who, parts = parse(name)
    if who == "reference":
        path = "solution"
    else:
        path = str(cache_free_submission(parts, designs(who, parts)))
    part = "-" if name.endswith("_all") else parts[0]
    tags = "-" if name == "reference_all" else "benchmark"  # the reference's whole grading
    return f"{name} {path} {part} {tags}"


def main(names: list[str]) -> int:
    try:
        for name in names:
            parse(name)  # every name checked before any copy is made
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in dict.fromkeys(names):
        print(line(name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
