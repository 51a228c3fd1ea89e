"""Naming the known mistake behind a failed Part 2 check (a mixin of ``Part2Base``).

The first public case's logits, or its error, are compared with the catalogue of
signatures that ``regen`` recorded for every mutant. Two mistakes at once in the
cached modes blend in the logits and match no single signature: the case then
runs again on copies of the public model with its positions or its attention
switched off (:func:`grader.parts.part2.cases.ablate`), where each shows alone.
Naming is a hint added to a message that stands on its own, so none of this
ever raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.judging.base import likely_cause
from grader.judging.logits import explain, matching_mistakes, several_causes
from grader.parts.part2.cases import ABLATIONS, CACHED_MODES
from grader.runtime.outcomes import SubmissionError


class Part2Diagnosis:
    """The diagnosis half of ``Part2Base``, which provides ``meta``, ``signatures``,
    ``course_cases`` and ``forward``."""

    meta: Any
    signatures: Any
    course_cases: Any
    forward: Any

    def diagnose(self, mode: str, steps: list[int] | None, observed: dict[str, Any]) -> list[Cause]:
        """Name the catalogued mistake behind a failure of the first public case in ``mode``.

        Whatever the submission returned, this never raises (no cause when nothing can be
        said).
        """
        try:
            return self.name_observed(mode, steps, observed)
        except Exception:
            return []

    def name_observed(
        self, mode: str, steps: list[int] | None, observed: dict[str, Any]
    ) -> list[Cause]:
        catalogue = self.signatures(mode)
        rerun_differs = None
        if "logits" in observed and any(s.get("nondeterministic") for s in catalogue.values()):
            ids = self.course_cases()[0]["input_ids"]
            try:
                again, _ = self.forward("public", ids, steps, what="forward (repeated)")
                rerun_differs = not np.allclose(
                    again, observed["logits"], atol=1e-5, equal_nan=True
                )
            except SubmissionError:
                rerun_differs = None
        names = matching_mistakes(observed, catalogue, rerun_differs)
        if not names and mode in CACHED_MODES and "logits" in observed:
            return self.diagnose_blend(mode, steps, observed["logits"])
        return likely_cause(names, self.meta()["diagnoses"], "the first case's logits or error")

    def diagnose_blend(self, mode: str, steps: list[int] | None, logits: np.ndarray) -> list[Cause]:
        """Name two mistakes whose blend gave ``logits`` in a cached mode.

        The first public case runs again on the public model with its positions, then
        its attention switched off; where one path is off, a mistake in the other shows
        alone and matches its catalogued signature. Never raises (none when nothing fits).
        """
        ids = self.course_cases()[0]["input_ids"]
        observed: dict[str, Any] = {mode: logits}
        diagnoses = self.meta()["diagnoses"]
        try:
            for kind in ABLATIONS:
                what = f"forward (case 1, the public model with {kind.replace('_', ' ')})"
                observed[f"{mode}@{kind}"], _ = self.forward(f"public@{kind}", ids, steps, what)
            names, several = explain(observed, {p: self.signatures(p) for p in observed}, set())
        except Exception:  # the model could not run, or anything else: the hint is optional
            return []
        if several:
            return several_causes(names, diagnoses)
        return likely_cause(names, diagnoses, "the case with one path switched off")
