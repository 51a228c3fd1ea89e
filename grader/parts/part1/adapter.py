"""Part 1 adapter: calls the calculator functions of ``question1.py``.

Model specs arrive as ``{"__spec__": {...}}`` and are rebuilt with the
student's own ``ModelSpec`` (or a stand-in with the same fields if theirs is
missing or broken), so every function sees the object the handout promises.

A course-style ``question1.py`` is a script that prints its answers and defines none
of the kit's functions: ``{"op": "run_script"}`` runs it as ``python question1.py``
would and returns what it printed (bounded), for the parent to read.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from values import MissingName, encode_value

module: Any = None

#: The functions the grader calls; a file defining none of them is run as a script.
KIT_FUNCTIONS = (
    "param_count",
    "weight_bytes",
    "kv_cache_bytes_per_request",
    "max_batch_size",
    "attention_flops",
    "attention_bytes",
    "arithmetic_intensity",
    "answer_table",
    "plot_prefill_ai",
    "plot_decode_ai",
)
#: Characters of a script's output kept for the parent (the rest is counted, not kept).
MAX_SCRIPT_OUTPUT = 64_000


@dataclass
class _FallbackSpec:
    n_layers: int
    n_q_heads: int
    n_kv_heads: int
    d_model: int
    d_ff: int
    vocab_size: int
    bytes_per_param: int = 2
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_q_heads


def setup() -> None:
    global module
    import question1

    module = question1


def _make_spec(fields: dict[str, Any]) -> Any:
    cls = getattr(module, "ModelSpec", None)
    if cls is not None:
        try:
            return cls(**fields)
        except Exception:
            pass
    return _FallbackSpec(**fields)


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__spec__" in value:
        return _make_spec(value["__spec__"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class _BoundedText(io.StringIO):
    """A stdout that keeps the first ``MAX_SCRIPT_OUTPUT`` characters and counts the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def write(self, text: str) -> int:
        room = max(MAX_SCRIPT_OUTPUT - self.tell(), 0)
        self.dropped += max(len(text) - room, 0)
        return super().write(str(text)[:room]) + max(len(text) - room, 0)


def run_script() -> dict[str, Any]:
    """Run ``question1.py`` as ``python question1.py`` (``__name__ == "__main__"``, its own
    ``sys.argv``, a headless matplotlib) and return what it printed. A file that defines
    any of the kit's functions is not run: the grader calls those."""
    defined = [name for name in KIT_FUNCTIONS if callable(getattr(module, name, None))]
    path = getattr(module, "__file__", None)
    if defined or not path:
        return {"defined": defined or ["?"]}
    os.environ.setdefault("MPLBACKEND", "Agg")
    out, argv, error = _BoundedText(), sys.argv, None
    sys.argv = [os.path.basename(path)]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            error = {"type": "SystemExit", "message": str(exc.code)[:500]}
    except Exception as exc:
        error = {"type": type(exc).__name__, "message": str(exc)[:500]}
    finally:
        sys.argv = argv
    return {"defined": [], "stdout": out.getvalue(), "dropped": out.dropped, "error": error}


def handle(request: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    if request.get("op") == "run_script":
        return run_script(), {}
    if request.get("op") != "call":
        raise ValueError(f"unknown request {request.get('op')!r}")
    name = request["func"]
    fn = getattr(module, name, None)
    if not callable(fn):
        raise MissingName(name)
    args = [_decode(a) for a in request.get("args", [])]
    kwargs = {k: _decode(v) for k, v in request.get("kwargs", {}).items()}
    return {"result": encode_value(fn(*args, **kwargs))}, {}
