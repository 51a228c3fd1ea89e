"""The benchmark thresholds file: one validated profile per device."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

THRESHOLDS_FILE = "thresholds.toml"


def parse_thresholds(text: str) -> dict[str, Any]:
    """Parse and validate the thresholds file's text; raise on anything malformed."""
    data = tomllib.loads(text)
    schema = json.loads(
        resources.files("grader").joinpath("schemas/thresholds.schema.json").read_text()
    )
    jsonschema.validate(data, schema)
    return data


def load_thresholds(device: str) -> dict[str, Any]:
    """The profile for ``device`` ("cpu" or "cuda") from the packaged thresholds file."""
    text = resources.files("grader").joinpath(THRESHOLDS_FILE).read_text()
    return parse_thresholds(text)[device]
