"""The benchmark thresholds file: one validated profile per device, and the leaderboard."""

from __future__ import annotations

import copy
import functools
import glob
import json
import os
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

THRESHOLDS_FILE = "thresholds.toml"
DEVICES = ("cpu", "cuda")


def parse_thresholds(text: str) -> dict[str, Any]:
    """Parse and validate the thresholds file's text; raise on anything malformed. Each
    caller gets a copy of its own: a grading reads the file about fifty times, and the
    schema's validation (20 ms) is done once per distinct text."""
    return copy.deepcopy(_validated(text))


@functools.lru_cache(maxsize=8)
def _validated(text: str) -> dict[str, Any]:
    data = tomllib.loads(text)
    schema = json.loads(
        resources.files("grader.core").joinpath("schemas/thresholds.schema.json").read_text()
    )
    jsonschema.validate(data, schema)
    for profile in ("cpu", "cuda"):
        part3 = data[profile].get("part3")
        if part3:  # each speedup names a timed batch size; at least one is judged
            judged, timed = set(part3["min_speedup"]), {str(b) for b in part3["batch_sizes"]}
            if not judged or not judged <= timed:
                raise jsonschema.ValidationError(
                    f"[{profile}.part3] min_speedup must judge some of batch_sizes "
                    f"{sorted(timed, key=int)}, not {sorted(judged)}"
                )
    return data


THRESHOLDS_ENV = "KVGRADER_THRESHOLDS"  # a thresholds file to use instead of the packaged one


def thresholds_text() -> str:
    """The thresholds file's text: the packaged one, or the file ``KVGRADER_THRESHOLDS``
    names (a TA trying a candidate profile, e.g. before ``calibrate``, and the tests)."""
    override = os.environ.get(THRESHOLDS_ENV)
    if override:
        return Path(override).read_text()
    return resources.files("grader.core").joinpath(THRESHOLDS_FILE).read_text()


def load_thresholds(device: str) -> dict[str, Any]:
    """The profile for ``device`` ("cpu" or "cuda") from the packaged thresholds file."""
    return parse_thresholds(thresholds_text())[device]


def probe_thresholds(part: str) -> dict[str, Any]:
    """The limits of ``part``'s work and growth probes (``[probes.<part>]``): one table
    for every device, since the probes run on the CPU in CPU time."""
    return parse_thresholds(thresholds_text())["probes"][part]


def profile_provisional(device: str) -> bool:
    """Whether ``device``'s profile is marked provisional (not calibrated on its device)."""
    return bool(load_thresholds(device).get("provisional", False))


def grading_budget_s(device: str) -> float | None:
    """The wall clock one whole grading on ``device`` may take, where its profile sets
    one (``grading_budget_s``); None: the sandbox's default (Gradescope's)."""
    budget = load_thresholds(device).get("grading_budget_s")
    return float(budget) if budget is not None else None


def timed_rounds(bench: dict[str, Any]) -> int:
    """The rounds one benchmark check times at most in a grading (``bench``: one part of
    a profile): warm-up, repeats and the confirmation of a miss."""
    return bench["warmup"] + bench["repeats"] + bench["confirm_repeats"]


def leaderboard_settings(text: str | None = None) -> dict[str, Any]:
    """The ``[leaderboard]`` table (``enabled`` false when the file has none)."""
    data = parse_thresholds(text if text is not None else thresholds_text())
    return {"enabled": False, "check": "3.11", **data.get("leaderboard", {})}


def leaderboard_entries(
    benchmarks: dict[str, dict[str, Any]], settings: dict[str, Any]
) -> list[dict[str, Any]]:
    """Gradescope leaderboard entries from the benchmark summaries of one run: the chosen
    check's cached decode tokens/s and its speedup over cache-free (none when switched
    off, or when that check measured nothing, e.g. it failed before timing)."""
    if not settings.get("enabled"):
        return []
    board = benchmarks.get(settings["check"], {}).get("leaderboard", {})
    if not {"tokens_per_s", "speedup"} <= board.keys():
        return []
    return [
        {"name": "Cached decode (tokens/s)", "value": round(board["tokens_per_s"], 1),
         "order": "desc"},
        {"name": "Speedup over cache-free", "value": round(board["speedup"], 2), "order": "desc"},
    ]  # fmt: skip


def resolve_device(requested: str) -> str:
    """The benchmark profile's device: ``requested`` itself, or for "auto" "cuda" when
    torch here sees a GPU, else "cpu". The probe runs only where an NVIDIA device node
    exists, so a CPU machine pays nothing for it."""
    if requested in DEVICES:
        return requested
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "cpu"
    probe = "import torch; print(int(torch.cuda.is_available()))"
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return "cuda" if out.stdout.strip() == "1" else "cpu"
