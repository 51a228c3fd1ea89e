"""Check 4.8's diagnosis by isolation: which runs ``measure_latency``'s figures stand for,
and in which unit, found by varying ``warmup`` alone and ``repeats`` alone.

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
  ``repeats``.
* **Units**: the figures against the right ones from the same runs: a factor of 1000 or
  1/1000, L / (L + prompt_len) (per token of the whole sequence), L (a whole run's time),
  ``repeats`` (the sum of the runs, not their mean). The base case's two L and the
  experiments' two ``repeats`` give every candidate a different pattern of ratios, so at
  most one fits all the calls.

A cause is stated only where one candidate fits every call within the bounds and no other
does; the clock (CPU time against wall time) is left to the readings of
:mod:`grader.parts.part4.latency_clock`, as the adapter records no CPU time of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grader.core.feedback_items import Cause
from grader.parts.part4.latency import LATENCY_KEYS
from grader.parts.part4.latency_clock import (
    AVERAGES,
    CLOCK_SLACK_S,
    CLOCKED_CASES,
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

    def fits(self, select: Select, scale: Callable[[int, Run], float]) -> bool:
        """Every figure the average of ``select``'s runs times ``scale`` (per second of
        one run; ms per generated token: 1000 / L), within the runs' bounds."""
        for key in LATENCY_KEYS:
            for x, L in zip(self.figures[key], self.case.L_values, strict=True):
                runs = select(groups_of(self.gens, key, L), self.warmup, self.repeats)
                if not runs or not _within(x, runs, scale(L, self), L):
                    return False
        return True


def _within(x: float, runs: list[Generation], per_s: float, L: int) -> bool:
    slack = FIGURE_SLACK_MS * per_s * L / 1000  # a figure rounded to 0.01 ms, rescaled
    for average in AVERAGES:
        low = average([g.low_s - CLOCK_SLACK_S for g in runs]) * per_s - slack
        high = average([g.high_s + CLOCK_SLACK_S for g in runs]) * per_s + slack
        if low <= x <= high:
            return True
    return False


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


def _which_runs(runs: list[Run]) -> list[Cause]:
    """Causes of the figures standing for the wrong runs, each fitting every call where
    it can be told apart and never the right runs there."""
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
    )  # fmt: skip
    for key, select, text, what in patterns:
        told = [r for r in runs if any(select(g, r.warmup, r.repeats) for g in _groups(r))]
        if told and all(r.fits(select, per_token) and not r.fits(_timed, per_token)
                        for r in told):  # fmt: skip
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


def _units(runs: list[Run]) -> list[Cause]:
    """The unit every call's figures are in, where one candidate fits them all."""
    fitting = [u for u in UNITS if all(r.fits(_timed, u[3]) for r in runs)]
    if not fitting or any(r.fits(_timed, per_token) for r in runs):
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


def latency_causes(runs: dict[str, Run]) -> list[Cause]:
    """What the isolating calls single out: an ignored argument, the wrong runs, or the
    wrong unit (none where nothing fits alone). ``runs``: the calls that returned figures
    and a readable record, by their case's words (:attr:`ClockedCase.what`)."""
    ignored = [c for c in (_ignored(runs, NO_WARMUP, "warmup"),
                           _ignored(runs, FEW_REPEATS, "repeats")) if c]  # fmt: skip
    if ignored:
        return ignored
    done = list(runs.values())
    return _which_runs(done) or _units(done)


def runs_table(runs: dict[str, Run]) -> str:
    """The generations each isolating call made per L and mode, for the check's notes."""
    return "; ".join(f"{_said(r)}: {_count(r)} per L and mode" for r in runs.values())
