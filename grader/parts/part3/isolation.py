"""Where Part 3's checks call the isolating experiments: after a check of logits or of
greedy text failed with no known mistake named, the place narrowed by experiment
(:mod:`.isolate_forward`, :mod:`.isolate_generate`) joins its feedback."""

from __future__ import annotations

from typing import Any

from grader.parts.part3 import isolate_forward, isolate_generate
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
