"""The timed runs of a benchmark and the ratio of two series of them: each run's
seconds on both clocks and its peak memory, a variant's runs, and a ratio with the spread
its confidence bound needs (:mod:`grader.runtime.verdicts`). The harness that times and
judges them is :mod:`grader.runtime.timing`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grader.runtime.verdicts import core_sigma, log_sigma


@dataclass(frozen=True)
class Sample:
    """One timed run: wall seconds, the worker's CPU seconds and, where measured, peak
    bytes. ``cpu_seconds`` is None where it could not be read; ratios then fall back to
    wall seconds."""

    seconds: float
    peak_bytes: int | None = None
    cpu_seconds: float | None = None
    peak_source: str | None = None  # "rss" (read by the grader) or "worker" (its own report)
    gpu_held_bytes: int | None = None  # GPU memory the worker held, read by the grader (NVML)

    def on(self, clock: str) -> float:
        """This run's seconds on ``clock``."""
        if clock == "cpu" and self.cpu_seconds is not None:
            return self.cpu_seconds
        return self.seconds


@dataclass(frozen=True)
class Timing:
    """The timed runs of one variant (warm-up runs already left out)."""

    samples: tuple[Sample, ...]

    @property
    def seconds(self) -> list[float]:
        return [s.seconds for s in self.samples]

    @property
    def cpu_seconds(self) -> list[float]:
        return [s.on("cpu") for s in self.samples]

    def on(self, clock: str) -> list[float]:
        """Every run's seconds on ``clock`` ("cpu" or "wall")."""
        return self.cpu_seconds if clock == "cpu" else self.seconds

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_seconds)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median: 0.1 means the runs lie within 10 % of the median."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median else 0.0

    @property
    def peak_bytes(self) -> int | None:
        peaks = [s.peak_bytes for s in self.samples if s.peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def gpu_held_bytes(self) -> int | None:
        held = [s.gpu_held_bytes for s in self.samples if s.gpu_held_bytes is not None]
        return max(held) if held else None

    @property
    def peak_source(self) -> str | None:
        """Where the runs' peaks were read; "worker" if any run's came from the worker
        itself (its figure is the submission's to forge)."""
        sources = {s.peak_source for s in self.samples if s.peak_bytes is not None}
        return "worker" if "worker" in sources else next(iter(sorted(sources)), None)

    def summary(self) -> dict[str, Any]:
        return {
            "median_s": self.median,
            "spread": self.spread,
            "runs_s": self.seconds,
            "cpu_median_s": self.cpu_median,
            "cpu_runs_s": self.cpu_seconds,
            "peak_bytes": self.peak_bytes,
            "peak_source": self.peak_source,
            "gpu_held_bytes": self.gpu_held_bytes,
        }


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` of two interleaved timings: the ratio of their medians,
    and the lowest and highest ratio of the runs paired by repeat (the spread). What a
    confidence bound needs (:mod:`grader.runtime.verdicts`) comes with it: how many runs,
    their robust log-spread and, against a yardstick, the yardstick's."""

    median: float
    low: float
    high: float
    runs: int = 0  # pairs (paired) or the numerator's runs (against a yardstick)
    sigma: float | None = None  # their log-spread (None: fewer than two)
    core: float | None = None  # their tightest half's log-spread, each series' (None: under 3)
    paired: bool = True  # both series from one worker, run by run
    yardstick_runs: int = 0
    yardstick_sigma: float | None = None  # the reference's log-spread: the machine's noise

    @classmethod
    def of(cls, numerator: Timing, denominator: Timing, clock: str = "wall") -> Ratio:
        """The ratio of two timings' seconds on ``clock`` ("wall" or "cpu")."""
        return cls.between(numerator.on(clock), denominator.on(clock))

    @classmethod
    def between(cls, numerators: Sequence[float], denominators: Sequence[float]) -> Ratio:
        """The ratio of two equally long series, paired by repeat."""
        pairs = [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]
        top, bottom = statistics.median(numerators), statistics.median(denominators)
        middle = top / bottom if bottom > 0 else float("inf")
        low, high = min(pairs, default=middle), max(pairs, default=middle)
        cores = [core_sigma(numerators), core_sigma(denominators)]
        core = math.hypot(*cores) if None not in cores else None  # each side's bursts apart
        return cls(middle, low, high, len(pairs), log_sigma(pairs), core)

    @classmethod
    def against(cls, numerator: Timing, yardstick: Timing, clock: str = "wall") -> Ratio:
        """``numerator`` over a timing of another process's runs (the reference's, timed in
        the same grading but not paired by repeat): the ratio of their medians, its spread
        each of the numerator's runs over the yardstick's median. NaN (every comparison
        false) when the yardstick has no positive median."""
        runs, yard = numerator.on(clock), yardstick.on(clock)
        bottom = statistics.median(yard)
        if not bottom > 0:
            return cls(math.nan, math.nan, math.nan, paired=False)
        ratios = [r / bottom for r in runs]
        middle = statistics.median(runs) / bottom
        spread = (len(runs), log_sigma(runs), core_sigma(runs), False, len(yard), log_sigma(yard))
        return cls(middle, min(ratios), max(ratios), *spread)

    def __str__(self) -> str:
        return f"{self.median:.2f}x (runs {self.low:.2f}-{self.high:.2f}x)"
