"""Where Part 3's checks call the isolating experiments: after a check of logits or of
greedy text failed with no known mistake named, the place narrowed by experiment
(:mod:`.isolate_forward`, :mod:`.isolate_generate`) joins its feedback; 3.10's draws are
explained by the temperature and top-p varied alone (:mod:`.isolate_sampling`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from grader.core.feedback_items import Cause
from grader.judging.base import likely_cause
from grader.parts.part3 import isolate_forward, isolate_generate, isolate_sampling
from grader.parts.part3.support import Part3Base


class Part3Isolation(Part3Base):
    """The checks' entry points to the experiments (no checks of its own)."""

    def isolate(self, model: str) -> None:
        """After a check of logits failed with no known mistake named, the place narrowed
        by experiment on ``model`` (:mod:`grader.parts.part3.isolate_forward`): its cause
        named, its lines after the failing cases. A known mistake's words stand alone."""
        if self.feedback.causes:
            return
        causes, lines = isolate_forward.narrow_forward(self, model)
        self.name(causes)
        self.feedback.notes.extend(lines)

    def isolate_generation(
        self, before: int, reply: Any, prompts: list[str], want: list[str], cache: bool, **kw: Any
    ) -> None:
        """After greedy text differed and no cause was named since ``before`` (the count
        of causes then), the place narrowed token by token (:mod:`.isolate_generate`)."""
        if len(self.feedback.causes) == before:
            named = {c.id for c in self.feedback.causes}
            found = isolate_generate.narrow_generation(self, reply, prompts, want, cache, **kw)
            self.name([c for c in found if c.id not in named])  # each place once per check

    def sampling_causes(self, logits: Any, names: list[str], top_p_right: bool) -> list[Cause]:
        """The causes of draws that do not follow the nucleus of softmax(logits / T): the
        temperature and top-p varied alone decide (:mod:`.isolate_sampling`); the library's
        ``names`` stand only where the temperature alone shows them (or where the
        experiments could not run). A wrong sample_top_p, which every draw passes through,
        leaves the temperature unjudged."""
        diagnoses = self.meta()["diagnoses"]
        if not top_p_right:  # the draws pass through sample_top_p: its own probe names it
            return []
        row = np.asarray(logits[0, 0], dtype=np.float64)
        found, known = isolate_sampling.temperature_causes(
            self, row, self.raw()["token_texts"], top_p_right
        )
        if not found and not known:
            return likely_cause(names, diagnoses, "the draws")
        evidence = "the draws with the temperature alone (top_p = 1)"
        return [*likely_cause(sorted(known), diagnoses, evidence), *found]
