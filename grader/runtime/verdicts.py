"""How a timed criterion is decided: a confidence bound on its ratio, round by round.

Every graded benchmark compares two series of run times by a ratio (cached against
cache-free, long against short, the submission against the reference timed in the same
grading). A round's runs are noisy, and on a shared machine the noise comes in bursts,
so a verdict is taken only once the figures decide it, and says so when they never do.
The rules, each with its reason, are all here; their constants are the ``[verdict]``
table of ``grader/core/thresholds.toml`` (schema-checked there).

- **The estimate** is the ratio of the two series' medians (what calibration proposes
  its limits from), on a log scale, where a ratio's noise is symmetric.
- **Its spread** is the series' own robust log-spread (:func:`log_sigma`: the median
  absolute deviation, which one stalled run does not move): of the pairs' log-ratios for
  two interleaved series of one worker, of the runs themselves against a yardstick.
- **The machine's noise** is the reference's log-spread in the same grading: its runs
  are trusted code, timed on the same machine under the same limits, so whatever spread
  they show is the machine's. A series of one round is taken to be as noisy as the
  machine; none is taken to be quieter than ``noise_floor`` (a few runs that agree by
  chance prove nothing).
- **A pass** is decided once the bound (``confidence_z`` standard errors of the median
  each side) lies wholly on the passing side of the limit: a working cache, with margins
  of several times, is decided after the first round.
- **A miss** is decided early only once the *best* run's bound lies wholly on the other
  side, after ``min_miss_rounds`` rounds, its width taking the runs' whole range: noise
  only adds time and comes in bursts, so a burst can make a few runs in a row look slow,
  never fast, and a miss must survive the best run the submission managed. A cache that
  does not cache misses with every run.
- **At the cap** (the part's ``repeats`` and ``confirm_repeats`` rounds) the median's
  bound decides if it clears either side (decided late where that took the confirmation
  rounds). Otherwise the criterion is *undecided*, and who made the noise decides:
  where the submission's runs, bursts left out (:func:`core_sigma`), are no noisier than
  ``own_noise_factor`` times the machine's, the noise is the machine's and the honest
  reading, the median, decides (flagged for a TA to time again on a quiet machine); where
  they are far noisier, the noise is the submission's own (runs that sleep or spin at
  random), and the pessimistic side of the bound decides: it fails, and the feedback says
  why. Without a yardstick in the grading there is no machine figure; the median decides,
  flagged.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from grader.core.thresholds import parse_thresholds, thresholds_text

#: The median's standard error over a normal sample's: sqrt(pi / 2).
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
#: A median absolute deviation times this is a normal sample's standard deviation.
MAD_TO_SIGMA = 1.4826

#: What a decided criterion's ``decision`` says (``""``: judged on its median alone, as a
#: criterion outside a sequential measurement is).
PASSED, MISSED = "passed", "missed"
#: Undecided at the cap: the machine's noise (passes), the submission's own (fails), or
#: no machine figure to tell them apart (the median decides: it missed).
UNDECIDED, OWN_NOISE, MEDIAN_MISSED = "undecided", "own noise", "undecided, median missed"
PASSING = (PASSED, UNDECIDED)
NOT_DECIDED = (UNDECIDED, OWN_NOISE, MEDIAN_MISSED)


@dataclass(frozen=True)
class VerdictSettings:
    """The ``[verdict]`` table of the thresholds file."""

    confidence_z: float
    noise_floor: float
    own_noise_factor: float
    min_miss_rounds: int


def verdict_settings() -> VerdictSettings:
    """The decision's constants, from the thresholds file in use."""
    table = parse_thresholds(thresholds_text())["verdict"]
    return VerdictSettings(
        float(table["confidence_z"]),
        float(table["noise_floor"]),
        float(table["own_noise_factor"]),
        int(table["min_miss_rounds"]),
    )


def log_sigma(values: Sequence[float]) -> float | None:
    """The robust spread of ``values`` on a log scale, as a normal sample's standard
    deviation: scaled median absolute deviation of their logs (two values: half their
    log-distance, scaled alike). None with fewer than two positive values."""
    logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
    if len(logs) < 2:
        return None
    centre = statistics.median(logs)
    return MAD_TO_SIGMA * statistics.median(abs(x - centre) for x in logs)


#: The shortest half of a normal sample spans this many standard deviations.
SHORTH_TO_SIGMA = 1.349


def core_sigma(values: Sequence[float]) -> float | None:
    """The log-spread of the tightest half of ``values`` (the shortest interval holding
    more than half of them), as a normal sample's standard deviation: what the runs show
    with any burst left out, however many runs it hit, short of half. Noise that only adds
    time, the machine's or the submission's, leaves the other runs together. None with
    fewer than three values."""
    logs = sorted(math.log(v) for v in values if v > 0 and math.isfinite(v))
    if len(logs) < 3:
        return None
    half = len(logs) // 2 + 1
    return min(logs[i + half - 1] - logs[i] for i in range(len(logs) - half + 1)) / SHORTH_TO_SIGMA


class Judged(Protocol):
    """What a bound needs of a ratio (:class:`grader.runtime.timing.Ratio`)."""

    median: float
    low: float
    high: float
    runs: int
    sigma: float | None
    core: float | None
    paired: bool
    yardstick_runs: int
    yardstick_sigma: float | None


def series_noise(ratio: Judged, machine: float, floor: float) -> float:
    """One run's log-noise for ``ratio``'s own series: its spread where it has one (never
    under ``floor``), else the machine's (one round: nothing else to go by). A paired
    ratio carries two runs' worth."""
    two = math.sqrt(2) if ratio.paired else 1.0
    if ratio.sigma is None:
        return max(machine, floor) * two
    return max(ratio.sigma, floor * two)


def yardstick_error(ratio: Judged, floor: float) -> float:
    """The log standard error of the yardstick's median (0 for a paired ratio)."""
    if ratio.paired or ratio.yardstick_runs < 1:
        return 0.0
    noise = max(ratio.yardstick_sigma or 0.0, floor)
    return MEDIAN_EFFICIENCY * noise / math.sqrt(ratio.yardstick_runs)


def median_bound(ratio: Judged, machine: float, s: VerdictSettings) -> tuple[float, float]:
    """The confidence bound of ``ratio``'s median, as ratios (low, high). NaN stays NaN."""
    own = series_noise(ratio, machine, s.noise_floor)
    own_error = MEDIAN_EFFICIENCY * own / math.sqrt(max(ratio.runs, 1))
    error = math.hypot(own_error, yardstick_error(ratio, s.noise_floor))
    return _around(ratio.median, s.confidence_z * error)


def best_run_bound(ratio: Judged, machine: float, s: VerdictSettings) -> tuple[float, float]:
    """The confidence bound of one run, around the run best for the submission: the
    lowest run's lower end and the highest run's upper end (a minimum's miss needs the
    upper end under it, a maximum's the lower end over it). Its width takes the runs'
    whole range too, not their median deviation alone: a burst that slowed some runs
    shows there, and it must not decide a miss while other runs disagree with it."""
    own = series_noise(ratio, machine, s.noise_floor)
    if ratio.low > 0 and math.isfinite(ratio.high):
        own = max(own, math.log(ratio.high / ratio.low) / 2)
    width = s.confidence_z * math.hypot(own, yardstick_error(ratio, s.noise_floor))
    return ratio.low * math.exp(-width), ratio.high * math.exp(width)


def _around(centre: float, width: float) -> tuple[float, float]:
    if not centre > 0:
        return (math.nan, math.nan)
    return centre * math.exp(-width), centre * math.exp(width)


def machine_noise(ratios: Sequence[Judged], floor: float) -> float | None:
    """The machine's log-noise in this grading: the largest spread of the reference's
    runs among ``ratios``' yardsticks (None where none has two runs)."""
    found = [r.yardstick_sigma for r in ratios if r.yardstick_sigma is not None]
    return max(max(found), floor) if found else None


def early_decision(
    ratio: Judged,
    limit: float,
    at_least: bool,
    rounds: int,
    machine: float | None,
    s: VerdictSettings,
) -> tuple[str, tuple[float, float]]:
    """PASSED or MISSED where ``rounds`` rounds already decide ("" where they do not),
    and the bound that decided (the median's for a pass, the best run's for a miss)."""
    noise = machine if machine is not None else s.noise_floor
    bound = median_bound(ratio, noise, s)
    if (bound[0] >= limit) if at_least else (bound[1] <= limit):
        return PASSED, bound
    if rounds < s.min_miss_rounds:
        return "", bound
    best = best_run_bound(ratio, noise, s)
    return (MISSED, best) if ((best[1] < limit) if at_least else (best[0] > limit)) else ("", bound)


def final_decision(
    ratio: Judged, limit: float, at_least: bool, machine: float | None, s: VerdictSettings
) -> tuple[str, tuple[float, float]]:
    """The decision at the cap and its bound: the median's bound where it clears either
    side, else UNDECIDED (passes) or OWN_NOISE (fails) by who made the noise (module
    docstring); MEDIAN_MISSED where no machine figure tells. NaN is missed."""
    noise = machine if machine is not None else s.noise_floor
    bound = median_bound(ratio, noise, s)
    low, high = bound
    if not ratio.median > 0:
        return MISSED, bound
    if (low >= limit) if at_least else (high <= limit):
        return PASSED, bound
    if (high < limit) if at_least else (low > limit):
        return MISSED, bound
    if machine is None:  # no machine figure: the median decides, and is flagged
        met = ratio.median >= limit if at_least else ratio.median <= limit
        return (UNDECIDED if met else MEDIAN_MISSED), bound
    allowed = s.own_noise_factor * machine * (math.sqrt(2) if ratio.paired else 1.0)
    own = ratio.core if ratio.core is not None else ratio.sigma
    if (own or 0.0) > allowed:
        return OWN_NOISE, bound
    met = ratio.median >= limit if at_least else ratio.median <= limit
    return (UNDECIDED if met else MEDIAN_MISSED), bound
