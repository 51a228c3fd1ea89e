"""The reference solution's timed runs, the yardstick of the timed checks (2.11, 3.7, 3.11,
4.6): bounded, and never the student's loss.

The reference is trusted code that runs in a worker of its own, with folders of its own
(``Sandbox.trusted_folders``): nothing the submission does should make it fail. Where it
fails anyway (a machine that kills it, a grader bug), that is the grader's fault: it is
timed at most :data:`ATTEMPTS` times, each in a fresh trusted worker, and a yardstick
that could not be measured is kept as none for the rest of the grading. The checks then
judge the submission on its own timings only (the comparison with the reference's is
left out, never failed), say so on the page without blaming the student, and flag the
check for the TA (the record's ``grader_fault``, the run's warnings).
"""

from __future__ import annotations

from typing import Any

from grader.runtime.context import GradingContext, live_pools_key
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import Timing, clock_for, until_steady

#: The reference's first timing of a part's workloads, and one retry in a fresh worker.
ATTEMPTS = 2

#: What a timed check's page says when its yardstick could not be measured.
NOT_MEASURED = (
    "The reference solution's own timed runs could not be measured in this grading (a "
    "fault of the grader, not of your code): this check is judged on your code's own "
    "timings only, without the comparison with the reference's, and is flagged for the "
    "course staff."
)


def fault_key(part: str) -> str:
    """Where a grading's scratch state keeps why ``part``'s yardstick is missing."""
    return f"{part}.yardstick_fault"


def time_reference(
    ctx: GradingContext, part: str, workloads: dict[str, Any]
) -> tuple[dict[str, dict[str, Timing]], str]:
    """``workloads`` (name -> run, variants, bench settings) timed on the reference, in a
    reference session of ``part`` (:meth:`GradingContext.reference_session`): the
    yardsticks and "", or none and why the last of :data:`ATTEMPTS` attempts failed. The
    reference sees none of what the checks learnt about the submission, and takes its
    prompts from the start of each pool (the submission's runs still get ones of their
    own: the pools' counters are given back untouched)."""
    why = ""
    for _ in range(ATTEMPTS):
        try:
            with ctx.reference_session(part, keep=[live_pools_key(part)]):
                clock = clock_for(ctx.device)
                return {
                    name: until_steady(
                        run,
                        list(variants),
                        warmup=bench["warmup"],
                        repeats=bench["repeats"],
                        clock=clock,
                    )
                    for name, (run, variants, bench) in workloads.items()
                }, ""
        except (AssertionError, SubmissionError) as exc:  # the session stopped its worker
            why = f"{exc}"
    return {}, why


def staff_warning(part: str, why: str) -> str:
    """The run's warning (for the TA) when ``part``'s yardstick could not be measured."""
    return (
        f"{part}: the reference solution's timed runs failed {ATTEMPTS} times ({why}); its "
        "timed checks were judged without the comparison with the reference: time them again"
    )
