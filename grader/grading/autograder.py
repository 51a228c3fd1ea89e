"""Grading inside Gradescope's tree: ``/autograder/{submission,results,submission_metadata.json}``.

``run_autograder`` calls :func:`main`. Before grading it applies the optional
submission limit of ``grader/grading/config.toml`` from Gradescope's metadata: a
submission over the limit is not graded; the student keeps the score of their
last graded submission and is told when the next one will count.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from grader.core.results import GradingResults, write_results
from grader.grading.runner import grade


@dataclass(frozen=True)
class SubmissionLimit:
    max_graded: int  # graded submissions per window; 0 means no limit
    window_hours: float


@dataclass(frozen=True)
class LimitVerdict:
    over: bool
    used: int  # graded submissions in the window before this one
    next_counts_at: datetime | None  # when a slot frees up (over the limit only)
    kept_score: float | None  # score of the last graded submission


def load_limit() -> SubmissionLimit:
    """The submission limit of the packaged ``config.toml``."""
    data = tomllib.loads(resources.files("grader.grading").joinpath("config.toml").read_text())
    section = data.get("submission_limit", {})
    limit = SubmissionLimit(
        int(section.get("max_graded", 0)), float(section.get("window_hours", 24))
    )
    if limit.max_graded < 0 or limit.window_hours <= 0:
        raise ValueError(f"config.toml: invalid submission_limit {section}")
    return limit


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def counted(previous: dict[str, Any]) -> bool:
    """Whether a previous submission was graded (one over the limit says it was not)."""
    results = previous.get("results") or {}
    return (results.get("extra_data") or {}).get("counted", True) is not False


def limit_verdict(metadata: dict[str, Any], limit: SubmissionLimit) -> LimitVerdict:
    """Apply ``limit`` to this submission, as described by Gradescope's metadata."""
    previous = [p for p in metadata.get("previous_submissions", []) if counted(p)]
    last = max(previous, key=lambda p: _time(p["submission_time"]), default=None)
    kept = float(last["score"]) if last and last.get("score") is not None else None
    if limit.max_graded == 0:
        return LimitVerdict(False, len(previous), None, kept)
    now = _time(metadata["created_at"])
    window = timedelta(hours=limit.window_hours)
    recent = sorted(
        t for t in (_time(p["submission_time"]) for p in previous) if now - window < t <= now
    )
    if len(recent) < limit.max_graded:
        return LimitVerdict(False, len(recent), None, kept)
    frees_at = recent[len(recent) - limit.max_graded] + window
    return LimitVerdict(True, len(recent), frees_at, kept)


def over_limit_results(
    verdict: LimitVerdict, limit: SubmissionLimit, max_score: float
) -> GradingResults:
    """What a student sees for a submission that was not graded."""
    when = verdict.next_counts_at.isoformat(timespec="minutes") if verdict.next_counts_at else "?"
    kept = verdict.kept_score if verdict.kept_score is not None else 0.0
    output = (
        f"This submission was not graded: the limit is {limit.max_graded} graded submissions "
        f"per {limit.window_hours:g} hours, and you have used {verdict.used}. Your score stays "
        f"{kept:g} / {max_score:g}, from your last graded submission. A submission made after "
        f"{when} will be graded. (Activate an earlier submission on Gradescope to keep its score.)"
    )
    return GradingResults(
        tests=[],
        output=output,
        score_override=kept,
        extra_data={"counted": False, "next_counts_at": when},
    )


def main(*, root: Path = Path("/autograder"), parts: list[str] | None = None) -> int:
    """Grade ``root/submission`` into ``root/results/results.json``; 0 unless the grader broke."""
    from grader.core.points import part_total
    from grader.core.registry import PARTS

    results_path = root / "results" / "results.json"
    metadata_path = root / "submission_metadata.json"
    metadata = json.loads(metadata_path.read_text()) if metadata_path.is_file() else {}
    limit = load_limit()
    if metadata.get("created_at") and limit.max_graded:
        verdict = limit_verdict(metadata, limit)
        if verdict.over:
            total = sum(part_total(p) for p in (parts or PARTS))
            write_results(over_limit_results(verdict, limit, total), results_path)
            return 0
    graded = grade(root / "submission", results_path=results_path, parts=parts)
    return 0 if graded is not None else 1
