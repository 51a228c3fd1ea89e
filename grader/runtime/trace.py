"""A TA's record of where a grading's time goes: with ``KVGRADER_TRACE`` naming a file,
every worker request answered appends one JSON line (part, the check that asked, whose
worker and its pid, what, timed or not, its seconds, the CPU seconds the grader read for
a timed one, and the seconds spent starting the worker first). For profiling a device
whose gradings cannot be watched (``benchmarks/gpu_cost.sh``) and for
``benchmarks/cost_breakdown.py``; off, it costs one lookup."""

from __future__ import annotations

import json
import os
from typing import Any

TRACE = "KVGRADER_TRACE"

#: The check now running (its number), named in each line; set by the suite's runner.
#: A class's set-up runs before its first check starts, so its requests name the check
#: before it.
_current: dict[str, str | None] = {"check": None}


def at_check(number: str | None) -> None:
    """Name ``number`` as the check whose requests the next lines record."""
    _current["check"] = number


def trace(**fields: Any) -> None:
    """Append ``fields``, with the check now running, as one JSON line to the file
    ``KVGRADER_TRACE`` names, if any."""
    path = os.environ.get(TRACE)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"check": _current["check"], **fields}, default=str) + "\n")
