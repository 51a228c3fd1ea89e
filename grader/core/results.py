"""Grading results as dataclasses, turned into Gradescope's ``results.json``.

The file is validated against ``schemas/results.schema.json`` (Gradescope's
published format) before it is written; if validation or serialisation fails
for any reason, a minimal valid file that says so is written instead, so
Gradescope always has something to show.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

MAX_TEST_OUTPUT_CHARS = 8000


@dataclass
class TestResult:
    """One graded check, in Gradescope's terms."""

    __test__ = False  # not a pytest test class, despite the name

    name: str
    score: float
    max_score: float
    status: str = "passed"  # "passed" | "failed"
    number: str = ""
    output: str = ""
    tags: list[str] = field(default_factory=list)
    visibility: str = "visible"
    extra_data: dict[str, Any] = field(default_factory=dict)
    output_format: str = ""  # "md" once rendered for Gradescope (grader.core.feedback)

    @property
    def part(self) -> str:
        """The part tag (``part1`` ... ``part4``) this check belongs to."""
        return next((t for t in self.tags if t.startswith("part")), "")

    def to_gradescope(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "score": round(float(self.score), 4),
            "max_score": float(self.max_score),
            "status": self.status,
            "visibility": self.visibility,
        }
        if self.number:
            entry["number"] = self.number
        if self.output:
            entry["output"] = truncate(self.output, MAX_TEST_OUTPUT_CHARS)
        if self.output_format:
            entry["output_format"] = self.output_format
        if self.tags:
            entry["tags"] = list(self.tags)
        if self.extra_data:
            entry["extra_data"] = self.extra_data
        return entry

    @classmethod
    def from_gradescope(cls, data: dict[str, Any]) -> TestResult:
        return cls(
            name=str(data.get("name", "")),
            score=float(data.get("score", 0.0) or 0.0),
            max_score=float(data.get("max_score", 0.0) or 0.0),
            status=str(data.get("status", "failed")),
            number=str(data.get("number", "")),
            output=str(data.get("output", "")),
            tags=[str(t) for t in data.get("tags") or []],
            visibility=str(data.get("visibility", "visible")),
            extra_data=dict(data.get("extra_data") or {}),
            output_format=str(data.get("output_format", "")),
        )


@dataclass
class GradingResults:
    """The whole submission's results."""

    tests: list[TestResult] = field(default_factory=list)
    output: str = ""
    execution_time: float = 0.0
    leaderboard: list[dict[str, Any]] = field(default_factory=list)
    extra_data: dict[str, Any] = field(default_factory=dict)
    stdout_visibility: str = "hidden"
    score_override: float | None = None  # a score not made of tests (e.g. over a limit)
    output_format: str = ""  # of the page's output; "md" once rendered for Gradescope

    @property
    def score(self) -> float:
        if self.score_override is not None:
            return self.score_override
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.max_score for t in self.tests)

    def by_part(self) -> dict[str, tuple[float, float]]:
        """``{part: (score, max_score)}`` in the order the parts appear."""
        totals: dict[str, tuple[float, float]] = {}
        for t in self.tests:
            score, max_score = totals.get(t.part, (0.0, 0.0))
            totals[t.part] = (score + t.score, max_score + t.max_score)
        return totals

    @classmethod
    def from_gradescope(cls, data: dict[str, Any]) -> GradingResults:
        """A results file read back; its score stands where it has no tests to add up."""
        results = cls(
            tests=[TestResult.from_gradescope(t) for t in data.get("tests", [])],
            output=str(data.get("output", "")),
            execution_time=float(data.get("execution_time", 0.0)),
            leaderboard=list(data.get("leaderboard") or []),
            extra_data=dict(data.get("extra_data") or {}),
            output_format=str(data.get("output_format", "")),
        )
        if not results.tests:
            results.score_override = float(data.get("score", 0.0))
        return results

    def to_gradescope(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "score": round(self.score, 4),
            "execution_time": round(self.execution_time, 2),
            "output": self.output,
            "stdout_visibility": self.stdout_visibility,
            "tests": [t.to_gradescope() for t in self.tests],
        }
        if self.output_format:
            data["output_format"] = self.output_format
        if self.leaderboard:
            data["leaderboard"] = self.leaderboard
        if self.extra_data:
            data["extra_data"] = self.extra_data
        return data


def truncate(text: str, limit: int) -> str:
    """Keep the start and the end of a long text, marking the cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head - 60
    return f"{text[:head]}\n[... {len(text) - head - tail:,} characters cut ...]\n{text[-tail:]}"


@cache
def results_schema() -> dict[str, Any]:
    """Gradescope's results format as a JSON schema."""
    text = resources.files("grader.core").joinpath("schemas/results.schema.json").read_text()
    return json.loads(text)


def validate_results(data: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``data`` is a valid results file."""
    jsonschema.validate(data, results_schema())
    for test in data.get("tests", []):
        if "score" in test and not math.isfinite(test["score"]):
            raise jsonschema.ValidationError(f"non-finite score in {test['name']!r}")


def fallback_results(message: str, max_score: float = 0.0) -> dict[str, Any]:
    """A minimal valid results file for when grading itself failed."""
    return {
        "score": 0.0,
        "output": message,
        "tests": [
            {
                "name": "Autograder error",
                "score": 0.0,
                "max_score": float(max_score),
                "status": "failed",
                "output": message,
                "visibility": "visible",
            }
        ],
    }


#: Room kept for results.json from the start of a grading: a submission that fills
#: the disk cannot stop the final file from being written over it.
RESERVED_BYTES = 2**20


def reserve_results(path: Path, message: str, max_score: float = 0.0) -> None:
    """Write a valid placeholder results file, padded to :data:`RESERVED_BYTES`.

    It stands if the grader dies without a word, and its blocks are reused by
    :func:`write_results` when the disk is full by then.
    """
    text = json.dumps(fallback_results(message, max_score=max_score), indent=2) + "\n"
    _atomic_write(Path(path), text.ljust(RESERVED_BYTES))


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _overwrite_in_place(path: Path, text: str) -> None:
    """Write over an existing file's blocks (no new space needed), then cut it to size."""
    data = text.encode()
    with open(path, "r+b") as f:
        if os.fstat(f.fileno()).st_size < len(data):
            raise OSError(errno.ENOSPC, "the reserved results file is too small")
        f.write(data)
        f.truncate(len(data))


def write_results(results: GradingResults | dict[str, Any], path: Path) -> dict[str, Any]:
    """Validate and atomically write ``results.json``; never raises on bad content.

    On a full disk it writes over the file :func:`reserve_results` left.
    """
    try:
        data = results.to_gradescope() if isinstance(results, GradingResults) else results
        validate_results(data)
        text = json.dumps(data, indent=2, allow_nan=False)
    except Exception as exc:
        data = fallback_results(
            "The autograder produced an invalid results file and replaced it with this one "
            f"({type(exc).__name__}: {exc}). Please tell the course staff."
        )
        text = json.dumps(data, indent=2)
    path = Path(path)
    try:
        _atomic_write(path, text + "\n")
    except OSError:
        if not path.is_file():
            raise
        _overwrite_in_place(path, text + "\n")
    return data
