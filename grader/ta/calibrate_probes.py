"""The work and growth probes of ``python -m grader calibrate``: checks 2.9's and 3.7's
limits (``[probes.<part>]`` of the thresholds file) measured as the benchmarks' are.

A probe grading is a grading of one submission (the sandbox, its worker account, the
hidden prompt pools, the CPU time the grader reads from the kernel) that runs only the
part's two probes, exactly as its checks call them, but unjudged: every round of each is
timed and neither stops when its ratio looks decided. The checks themselves cannot
be graded for this: a cache-free design loses 2.9 and 3.7 to its forward calls before
either probe runs, while its ratios are what the limits are proposed from.

Which parts have probes is the thresholds file's to say (a ``[probes.<part>]`` table);
the probes are the part's checks' own methods (a :class:`TimedPools` check class).
They run on the CPU whatever device the grading is on, so they have one profile.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from grader.core.paths import TEST_CASES
from grader.core.registry import imports_ahead
from grader.core.thresholds import parse_thresholds, thresholds_text
from grader.grading.suite import check_classes
from grader.judging.timed_pools import TimedPools

#: The probes' limits, each a criterion of the thresholds file's ``[probes.<part>]``:
#: its label in the report and whether the ratio must be at least (or at most) the limit.
PROBE_LIMITS = {
    "min_work_ratio": ("work probe: cache-free over cached CPU time", True),
    "max_cached_growth": ("growth probe: cached CPU time per new token, long over short", False),
}
#: Where the probes' proposals go in the thresholds file: one table for every device.
PROBES_TABLE = "probes"


def probe_parts(parts: list[str]) -> list[str]:
    """Those of ``parts`` whose probes the thresholds file limits (``[probes.<part>]``)."""
    probed = parse_thresholds(thresholds_text()).get(PROBES_TABLE, {})
    return [p for p in parts if isinstance(probed.get(p), dict)]


def probe_class(part: str) -> type[TimedPools]:
    """The check class of ``part`` that runs its work and growth probes."""
    for cls in check_classes(part):
        if issubclass(cls, TimedPools):
            return cls
    raise ValueError(f"{part} has [probes.{part}] limits but no check class with the probes")


def unjudged(cls: type[TimedPools], ctx: object) -> TimedPools:
    """A check of ``cls`` bound to ``ctx`` (as the runner binds it) whose probes are not
    judged: with no limit (``min_work_ratio``, ``max_cached_growth`` None) every round of
    each probe is timed and counted (:meth:`TimedPools.interleaved_work`,
    :meth:`TimedPools.cached_growth`)."""
    attrs = {"ctx": ctx, "__module__": cls.__module__, "runTest": lambda self: None}
    attrs.update(min_work_ratio=None, max_cached_growth=None)
    probe = type(cls.__name__, (cls,), attrs)()  # "runTest": no check, no check number
    probe.setUp()  # the feedback a failure writes to
    return probe  # type: ignore[return-value]


def probe_ratios(probe: TimedPools, part: str) -> dict[str, float]:
    """``part``'s two probes, each one median over all its rounds, by criterion key."""
    try:
        work, _ = probe.work_probe()
        growth = probe.growth_probe()
    except AssertionError as exc:  # a timed run's answer was wrong: its time cannot count
        raise RuntimeError(f"{part}'s probes failed during calibration: {exc}") from None
    return {f"{part}.min_work_ratio": work.median, f"{part}.max_cached_growth": growth.median}


def probe_grading(submission: Path, parts: list[str]) -> dict[str, float]:
    """One grading of ``submission`` that runs only the probes of ``parts``, on the CPU:
    each probe's median ratio by criterion key (``part2.min_work_ratio``, ...)."""
    from grader.grading.runner import Grading, limits_for

    out = Path(tempfile.mkdtemp(prefix="calibrate-probes-"))
    run = Grading(Path(submission), out / "results.json", parts, limits_for("cpu"), TEST_CASES)
    ratios: dict[str, float] = {}
    try:
        run.reserve()
        run.open_sandbox(None, ())
        run.hand_over("cpu")
        assert run.ctx is not None
        run.ctx.ahead = imports_ahead(parts)
        for part in parts:
            ratios.update(probe_ratios(unjudged(probe_class(part), run.ctx), part))
    finally:
        run.close()  # the workers stopped, the sandbox removed (its results: a fallback)
        shutil.rmtree(out, ignore_errors=True)
    return ratios
