"""Check 4.8's diagnosis by isolation: which runs ``measure_latency``'s figures stand for,
in which unit and on which clock, found by varying ``warmup`` alone and ``repeats`` alone.

The mutant library names the latency mistakes it was told about; this module answers for
the others the way a TA debugs. It runs only once 4.8 has failed without a catalogued
cause: the check calls ``measure_latency`` again through the worker's ``latency_timed``
request (:mod:`grader.parts.part4.latency_clock`), with the base case's arguments, with
``warmup = 0`` and with ``repeats = 2``, and reads the adapter's record of every generation
each call made (how many per L and mode, and the bounds any clock's time of each lies in).

* **Which runs**: the number of generations per L must follow ``warmup`` and
  ``repeats`` (the lab may add untimed runs of its own, a fixed number); the figures must
  be the average of the last ``repeats`` runs, not of every run (the warm-ups counted),
  of the first timed run alone, or of the runs left once the warm-ups were taken out of
  ``repeats``; nor the time from one start of the clock, read once before the timed runs
  (or before the warm-ups), to the end of each run (the runs added up as they go).
* **Units**: the figures against the right ones from the same runs: a factor of 1000 or
  1/1000, L / (L + prompt_len) (per token of the whole sequence), L (a whole run's time),
  ``repeats`` (the sum of the runs, not their mean). The base case's two L and the
  experiments' two ``repeats`` give every candidate a different pattern of ratios, so at
  most one fits all the calls.

* **The clock**: the adapter records the process's and the thread's CPU time beside its
  wall clock, so each run has bounds on both; the grader's waits in every run are sleeps
  (5 to 47 ms of wall time and next to no CPU time), which sets the two kinds of bounds
  apart on purpose. The figures are named CPU time (``time.process_time``,
  ``time.thread_time``) when every call's fit the right runs on a CPU clock and none
  fit them on wall time.

A cause is stated only where one candidate fits every call within the bounds and no other
does: where a reading on wall time and one on CPU time both fit, nothing is named.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from grader.core.feedback_items import Cause
from grader.parts.part4.latency import LATENCY_KEYS
from grader.parts.part4.latency_clock import (
    AVERAGES,
    CLOCK_SLACK_S,
    CLOCKED_CASES,
    CLOCKS,
    FIGURE_SLACK_MS,
    ClockedCase,
    Generation,
    groups_of,
)

BASE = CLOCKED_CASES[0]  # L = (2, 5), prompt_len = 6, warmup = 2, repeats = 5
NO_WARMUP = ClockedCase(BASE.L_values, {**BASE.args, "warmup": 0})
FEW_REPEATS = ClockedCase(BASE.L_values, {**BASE.args, "repeats": 2})
#: The calls the isolation makes: the base case, warmup varied alone, repeats varied alone.
EXPERIMENTS = (BASE, NO_WARMUP, FEW_REPEATS)

#: Which of a group's runs (one L and mode, in the order they ran) a figure stands for,
#: given the call's warmup and repeats; None where the selection cannot be told apart.
Select = Callable[[list[Generation], int, int], list[Generation] | None]


@dataclass(frozen=True)
class Run:
    """One isolating call: its case, the figures it returned, the generations it made."""

    case: ClockedCase
    figures: dict[str, list[float]]
    gens: list[Generation]

    @property
    def warmup(self) -> int:
        return self.case.settings["warmup"]

    @property
    def repeats(self) -> int:
        return self.case.settings["repeats"]

    def counts(self) -> set[int]:
        """How many generations it made per L and mode (one number where all agree)."""
        return {
            len(groups_of(self.gens, key, L)) for key in LATENCY_KEYS for L in self.case.L_values
        }

    def fits(self, select: Select, scale: Callable[[int, Run], float], clock: str = "wall") -> bool:
        """Every figure the average of ``select``'s runs times ``scale`` (per second of
        one run; ms per generated token: 1000 / L), within the runs' bounds on
        ``clock`` (one of :data:`CLOCKS`)."""
        for key in LATENCY_KEYS:
            for x, L in zip(self.figures[key], self.case.L_values, strict=True):
                runs = select(groups_of(self.gens, key, L), self.warmup, self.repeats)
                if not runs or not _within(x, runs, scale(L, self), L, clock):
                    return False
        return True

    def recorded(self, clock: str) -> bool:
        """Whether every generation has bounds on ``clock``."""
        return bool(self.gens) and all(g.bounds(clock) for g in self.gens)


def _within(x: float, runs: list[Generation], per_s: float, L: int, clock: str = "wall") -> bool:
    bounds = [g.bounds(clock) for g in runs]
    if not all(bounds):
        return False
    slack = FIGURE_SLACK_MS * per_s * L / 1000  # a figure rounded to 0.01 ms, rescaled
    for average in AVERAGES:
        low = average([lo - CLOCK_SLACK_S for lo, _ in bounds]) * per_s - slack
        high = average([hi + CLOCK_SLACK_S for _, hi in bounds]) * per_s + slack
        if low <= x <= high:
            return True
    return False


def _span(runs: list[Generation], per_s: float, clock: str) -> str:
    """The bounds of the median of ``runs`` on ``clock``, in the figure's unit."""
    bounds = [g.bounds(clock) or (0.0, 0.0) for g in runs]
    low = statistics.median(lo for lo, _ in bounds) * per_s
    high = statistics.median(hi for _, hi in bounds) * per_s
    return f"between {low:.4g} and {high:.4g}"


def _timed(group: list[Generation], _: int, repeats: int) -> list[Generation] | None:
    return group[-repeats:] if len(group) >= repeats else None


def _every(group: list[Generation], warmup: int, repeats: int) -> list[Generation] | None:
    """The loop's warm-up and timed runs together (the same runs as _timed without any)."""
    n = warmup + repeats
    return group[-n:] if warmup and len(group) >= n else None


def _first_timed(group: list[Generation], _: int, repeats: int) -> list[Generation] | None:
    return group[-repeats:][:1] if repeats >= 2 and len(group) >= repeats else None


def _inside_repeats(group: list[Generation], warmup: int, repeats: int) -> list | None:
    kept = repeats - warmup  # `for i in range(repeats): if i >= warmup`
    return group[-kept:] if warmup and kept > 0 and len(group) == repeats else None


def _from(origin: Generation, timed: list[Generation]) -> list[Generation] | None:
    """The timed runs as a clock started once before ``origin`` times them: from that
    start to the end of each (its bounds on wall time; none on the CPU clocks)."""
    if origin.span is None or any(g.span is None for g in timed):
        return None
    earliest, began = origin.span[:2]
    return [replace(g, low_s=g.span[2] - began, high_s=g.span[3] - earliest, cpu=None,
                    thread=None) for g in timed]  # fmt: skip


def _started_once(group: list[Generation], _: int, repeats: int) -> list[Generation] | None:
    """`start = clock()` read once before the timed runs: each run's time from there."""
    return _from(group[-repeats], group[-repeats:]) if 2 <= repeats <= len(group) else None


def _started_before_warmups(group: list[Generation], warmup: int, repeats: int) -> list | None:
    """`start = clock()` read once before the loop of the warm-up and the timed runs."""
    n = warmup + repeats
    return _from(group[-n], group[-repeats:]) if warmup and len(group) >= n else None


def per_token(L: int, _: Run) -> float:
    return 1000 / L


#: The units a figure may be in, against ms per generated token: (id, the sentence's
#: words, the ratio's words, figure per second of one run).
UNITS: tuple[tuple[str, str, str, Callable[[int, Run], float]], ...] = (
    ("ms_times_1000", "multiplies ms per token by 1000 once more (microseconds)",
     "1000", lambda L, r: 1e6 / L),
    ("seconds", "reports seconds per token, not milliseconds", "1/1000", lambda L, r: 1 / L),
    ("whole_sequence", "divides by L + prompt_len, the whole sequence, not by the L "
     "generated tokens", "L / (L + prompt_len)",
     lambda L, r: 1000 / (L + r.case.settings["prompt_len"])),
    ("per_run_total", "reports the time of a whole generation, not divided by L", "L",
     lambda L, r: 1000.0),
    ("sum_of_runs", "adds the timed runs up instead of averaging them", "repeats",
     lambda L, r: r.repeats * 1000 / L),
)  # fmt: skip


def _said(run: Run) -> str:
    s = run.case.settings
    return f"warmup={s['warmup']}, repeats={s['repeats']}"


def _count(run: Run) -> str:
    counts = sorted(run.counts())
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def _ignored(runs: dict[str, Run], varied: ClockedCase, arg: str) -> Cause | None:
    """The argument ``arg`` ignored in how many runs it makes: the base case and the call
    that varied it alone made the same number of generations per L and mode, and the
    figures of one of them are no right reading in any unit."""
    base, other = runs.get(BASE.what), runs.get(varied.what)
    if base is None or other is None or len(base.counts()) != 1:
        return None
    if base.counts() != other.counts():
        return None
    if all(any(r.fits(_timed, u[3]) for u in (*UNITS, ("", "", "", per_token)))
           for r in (base, other)):  # fmt: skip
        return None
    a, b = other.case.settings[arg], base.case.settings[arg]
    evidence = (f"with {arg}={a} and {arg}={b} it made the same {_count(base)} generations "
                "per L and mode")  # fmt: skip
    text = (f"your measure_latency ignores its {arg} argument: {evidence}; it must run "
            "warmup untimed runs, then time repeats runs, per L and mode")  # fmt: skip
    return Cause(f"isolated:latency_ignores_{arg}", text, evidence)


def _which_runs(runs: list[Run], clock: str = "wall") -> list[Cause]:
    """Causes of the figures standing for the wrong runs, each fitting every call where
    it can be told apart and never the right runs there (on ``clock``)."""
    found = []
    patterns = (
        ("counts_warmup", _every, "counts its warm-up runs in the figures: each is the "
         "average of the warmup + repeats runs of its L and mode, warm-ups included; time "
         "only the repeats runs after them", "the average of the last {w} + {r} runs"),
        ("first_run_only", _first_timed, "times only the first run: each figure is that "
         "one run's time, not the median of the repeats timed runs", "the first timed run "
         "alone"),
        ("warmup_inside_repeats", _inside_repeats, "takes its warm-up runs out of repeats: "
         "it makes repeats runs and times those after the first warmup, where the handout "
         "makes warmup + repeats runs and times repeats of them", "the last {k} of {n} runs"),
        ("clock_started_once", _started_once, "reads the start of its clock once, before "
         "the timed runs, and the end after each: every time runs from the first timed "
         "run's start, so it adds the runs before it up; read the clock just before each "
         "run and again just after it", "the time from the start of its first timed run "
         "to the end of each, the runs added up"),
        ("clock_started_before_warmups", _started_before_warmups, "reads the start of its "
         "clock once, before the warm-up runs, and the end after each timed run: every "
         "time holds the warm-ups and the runs before it; read the clock just before each "
         "timed run and again just after it", "the time from the start of the first "
         "warm-up to the end of each timed run, the runs added up"),
    )  # fmt: skip
    for key, select, text, what in patterns:
        told = [r for r in runs if any(select(g, r.warmup, r.repeats) for g in _groups(r))]
        if told and all(r.fits(select, per_token, clock) and
                        not r.fits(_timed, per_token, clock) for r in told):  # fmt: skip
            r = told[0]
            runs_of = what.format(n=_count(r), k=r.repeats - r.warmup, w=r.warmup, r=r.repeats)
            evidence = (
                f"with {_said(r)} it made {_count(r)} generations per L and mode, "
                f"and each figure is {runs_of}"
            )
            found.append(Cause(f"isolated:latency_{key}", f"your measure_latency {text}",
                               evidence))  # fmt: skip
    return found


def _groups(run: Run) -> list[list[Generation]]:
    return [groups_of(run.gens, k, L) for k in LATENCY_KEYS for L in run.case.L_values]


def _units(runs: list[Run], clock: str = "wall") -> list[Cause]:
    """The unit every call's figures are in (on ``clock``), where one candidate fits
    them all."""
    fitting = [u for u in UNITS if all(r.fits(_timed, u[3], clock) for r in runs)]
    if not fitting or any(r.fits(_timed, per_token, clock) for r in runs):
        return []
    calls = "; ".join(_said(r) for r in runs)
    if len(fitting) == 1:
        [(key, text, ratio, _)] = fitting
        evidence = (f"every figure is {ratio} times the ms per generated token of its timed "
                    f"runs ({calls})")  # fmt: skip
        return [Cause(f"isolated:latency_{key}", f"your measure_latency {text}", evidence)]
    ratios = " or ".join(u[2] for u in fitting)
    evidence = f"every figure is {ratios} times the right one ({calls})"
    text = ("your measure_latency " + "; or ".join(u[1] for u in fitting)
            + ": a call with other L values tells them apart")  # fmt: skip
    return [Cause("isolated:latency_" + "+".join(u[0] for u in fitting), text, evidence)]


#: The CPU clocks by the words a cause uses for them.
CPU_CLOCKS = {
    "process": "the process's CPU time (time.process_time: every thread's)",
    "thread": "the thread's CPU time (time.thread_time)",
}


def _on_cpu(runs: list[Run]) -> list[Cause]:
    """The figures read on a CPU clock: every call's fit the right runs (or one wrong
    reading of :func:`_which_runs` or :func:`_units`, named too) on the process's or the
    thread's CPU time, and no call's fit the right runs on wall time. The grader's waits
    (sleeps in every run) set the two apart; where both CPU clocks fit, both are named."""
    clocks = [c for c in CLOCKS[1:] if all(r.recorded(c) for r in runs)]
    if not runs or not clocks or any(r.fits(_timed, per_token) for r in runs):
        return []
    explained: dict[str, list[Cause]] = {}
    for clock in clocks:
        if all(r.fits(_timed, per_token, clock) for r in runs):
            explained[clock] = []
        elif more := _which_runs(runs, clock) or _units(runs, clock):
            explained[clock] = more
    if not explained:
        return []
    which = list(explained)
    if len(which) == 1:
        named = CPU_CLOCKS[which[0]]
    else:
        named = ("CPU time (time.process_time or time.thread_time, which differ only where "
                 "several threads work)")  # fmt: skip
    run = runs[0]
    key, L, x = LATENCY_KEYS[0], run.case.L_values[0], run.figures[LATENCY_KEYS[0]][0]
    timed = _timed(groups_of(run.gens, key, L), run.warmup, run.repeats) or []
    waits = sorted(run.case.waits_s)
    on = "CPU time" if len(which) > 1 else f"{which[0]}'s CPU time"
    evidence = (
        f"the grader made every run wait {waits[0] * 1000:.0f} to {waits[-1] * 1000:.0f} ms "
        "asleep: wall time counts the wait, CPU time only what the process's threads ran "
        f"meanwhile; every figure fits the {on} "
        f"of its timed runs and none their wall time ({_said(run)}: {key} at L = {L} is "
        f"{x:.4g}; by the {on} of its runs it would be {_span(timed, 1000 / L, which[0])} "
        f"ms per token, by their wall time {_span(timed, 1000 / L, 'wall')})"
    )
    text = (
        f"your measure_latency times with {named}, not with wall time: CPU time leaves out "
        "what a generation waits for (on a GPU, the device's work; here, the grader's "
        "waits), and with several threads it counts every core's time. Latency is the "
        "wall-clock time a generation takes: time.perf_counter()"
    )
    more = explained[which[0]]
    if any([c.id for c in explained[w]] != [c.id for c in more] for w in which):
        more = []  # the CPU clocks disagree on what else is wrong: the clock alone
    return [Cause("isolated:latency_cpu_time", text, evidence), *more]


def latency_causes(runs: dict[str, Run]) -> list[Cause]:
    """What the isolating calls single out: an ignored argument, the wrong runs, the
    wrong unit or the wrong clock (none where nothing fits alone, or where a reading on
    wall time and one on CPU time both fit). ``runs``: the calls that returned figures
    and a readable record, by their case's words (:attr:`ClockedCase.what`)."""
    ignored = [c for c in (_ignored(runs, NO_WARMUP, "warmup"),
                           _ignored(runs, FEW_REPEATS, "repeats")) if c]  # fmt: skip
    if ignored:
        return ignored
    done = list(runs.values())
    on_wall, on_cpu = _which_runs(done) or _units(done), _on_cpu(done)
    return [] if on_wall and on_cpu else on_wall or on_cpu


def runs_table(runs: dict[str, Run]) -> str:
    """The generations each isolating call made per L and mode, for the check's notes."""
    return "; ".join(f"{_said(r)}: {_count(r)} per L and mode" for r in runs.values())
