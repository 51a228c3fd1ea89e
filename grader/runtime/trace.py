"""A TA's record of where a grading's time goes: with ``KVGRADER_TRACE`` naming a file,
every worker request answered appends one JSON line (part, whose worker, what, timed or not, its
seconds and the seconds spent starting the worker first). For profiling a device whose
gradings cannot be watched (``benchmarks/gpu_cost.sh``); off, it costs one lookup."""

from __future__ import annotations

import json
import os
from typing import Any

TRACE = "KVGRADER_TRACE"


def trace(**fields: Any) -> None:
    """Append ``fields`` as one JSON line to the file ``KVGRADER_TRACE`` names, if any."""
    path = os.environ.get(TRACE)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(fields, default=str) + "\n")
