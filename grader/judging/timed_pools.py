"""What Parts 2 and 3 share for their measured runs: the hidden prompt pools built at
``regen`` time (each prompt used once per grading) and the interleaved work probe
whose CPU time the grader reads.

The parts differ in what a prompt is (token ids or text), what a run is called with
and what its answer must equal; those stay in each part's ``timed.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grader.core.thresholds import load_thresholds
from grader.judging.base import Workload
from grader.runtime.context import GradingContext, live_pools_key
from grader.runtime.timing import Ratio, Sample, Timing, decided_once

WITHOUT, WITH = "without the cache", "with the cache"
WORK_REFERENCE_ROUNDS = 2  # the reference's cached work-probe runs, the yardstick of the probe
#: A probe's ratio this many times on the passing side of its threshold needs no more
#: rounds; on the missing side it takes the wider ``MISS_EARLY``: a burst of load that
#: slows one run must not decide a miss, while nothing makes a cache-free path look
#: this much faster than it is.
PASS_EARLY, MISS_EARLY = 1.5, 2.0


def pools_built(ctx: GradingContext, part: str) -> dict[str, Any]:
    """The prompt pools the reference built for ``part`` in this grading (a GPU workload's),
    by key: a pool, or why it could not be built."""
    return ctx.scratch.setdefault(live_pools_key(part), {})


def build_pool(ctx: GradingContext, part: str, key: str, build: Callable[[], Any]) -> None:
    """Keep ``build()`` as ``part``'s pool ``key`` for this grading (once, and only when the
    submission has the part's file), or why it failed: the grader's fault, reported by the
    benchmark check that needs the pool."""
    store = pools_built(ctx, part)
    if key in store or ctx.bases.get(part) is None:
        return
    try:
        store[key] = build()
    except Exception as exc:
        store[key] = f"{type(exc).__name__}: {exc}"


def pool_fault(why: str) -> str:
    """The message of a benchmark whose pool the reference could not build."""
    return (
        "Grader fault, not yours: the reference solution could not build this benchmark's "
        f"prompts on the grading device ({why}). Tell your TA."
    )


def decided(ratio: Ratio, threshold: float, *, at_least: bool = True) -> bool:
    """Whether ``ratio`` is so far from ``threshold`` (``PASS_EARLY`` times on the side it
    must reach, ``at_least`` or at most, or ``MISS_EARLY`` times on the other) that more
    rounds cannot change the verdict. False for NaN: keep measuring."""
    if at_least:
        return ratio.median >= threshold * PASS_EARLY or ratio.median <= threshold / MISS_EARLY
    return ratio.median <= threshold / PASS_EARLY or ratio.median >= threshold * MISS_EARLY


class TimedPools:
    """A mixin of a part's checks (it needs ``meta``, ``ctx``, ``fail`` and
    ``once_per_grading``)."""

    part: str  # set by the part's base class; names the pool counters in the scratch state
    min_work_ratio: float  # the work probe's threshold: cache-free over cached CPU time
    work_shape: tuple[int, int, int]  # the work probe's (new tokens, prompts, prompt tokens)

    def work_probe(self) -> tuple[Ratio, dict[str, Timing]]:
        """The part's interleaved cached and cache-free runs (see :meth:`interleaved_work`)."""
        raise NotImplementedError

    def work_advice(self, ratio: Ratio, cpu: dict[str, float]) -> str:
        """The part's message when its cached path did not do less work."""
        raise NotImplementedError

    max_cached_growth: float  # the growth probe's maximum: long run's CPU per token / short's
    growth_shape: tuple[int, int, int, int]  # (prompts, prompt tokens, short, long new tokens)
    growth_label: str  # how the cached runs call generate, for the printed figures

    def growth_probe(self) -> Ratio:
        """The part's cached runs, short and long (see :meth:`cached_growth`)."""
        raise NotImplementedError

    def growth_advice(self, growth: Ratio) -> str:
        """The part's message when its cached path's cost per token grew."""
        raise NotImplementedError

    def growth_calls_problem(self) -> str:
        """Why the growth probe's cached runs, as the worker recorded their model calls,
        were not the prompt once and then one token per call ("" when they were). Their
        long runs show a ``generate`` that starts over every few steps, at any period up to
        64, where the benchmarks' runs are too short to; the record names an honest
        design, and the yardstick stops a forger (:mod:`grader.judging.calls`)."""
        raise NotImplementedError

    def growth_problem(self) -> str:
        """Why the cached path's CPU time per token grew with the length ("" when it did
        not). Measured once per grading (the work check and the benchmark both ask, and
        the growth pools hold the prompts of one probe), its figures printed with the
        first check that asks."""
        return self.once_per_grading("growth_problem", self.measure_growth)

    def measure_growth(self) -> str:
        """Run the growth probe, print its figures and judge them."""
        growth = self.growth_probe()
        rows, prompt, short, long = self.growth_shape
        print(
            f"Growth probe ({rows} prompts of {prompt} tokens, {self.growth_label}, CPU time "
            f"measured by the grader): CPU time per new token with {long} new tokens over "
            f"that with {short}: {growth} (at most {self.max_cached_growth:g}x)."
        )
        if not growth.median <= self.max_cached_growth:  # True for NaN
            return self.growth_advice(growth)
        return self.growth_calls_problem()

    def work_problem(self) -> str:
        """Why the cached path was not seen to do less work than the cache-free one, to keep
        its cost per step flat, or to cost about what the reference's does ("" when it
        did all three). Each is measured by the grader in CPU time; a cache-free path slowed
        on purpose passes the first, padded short runs the second, not the third."""
        ratio, timings = self.work_probe()
        cpu = self.report_work(ratio, timings, *self.work_shape)
        if not ratio.median >= self.min_work_ratio:  # True for NaN
            return self.work_advice(ratio, cpu)
        return self.growth_problem() or self.work_versus_reference(timings[WITH])

    def work_versus_reference(self, cached: Timing) -> str:
        """The work probe's ``cached`` runs against the reference's on the same prompts,
        timed in this grading by a trusted worker (``max_vs_reference`` of the part's
        profile): "" when within the limit or not judged."""
        reference = self.yardstick("work")
        if not reference:
            return ""
        bench = load_thresholds(self.ctx.device)[self.part]
        (criterion,) = self.versus_reference({WITH: cached}, reference, bench, "cpu")
        criterion = decided_once(criterion)  # undecided: judged by who made the noise
        print(f"Work probe, {criterion.describe()}")
        if criterion.passed:  # False for NaN
            return ""
        return (
            f"With the cache, the work probe took {criterion.ratio.median:.1f}x the CPU time of "
            f"the reference solution's cached path on the same prompts (at most "
            f"{criterion.limit:g}x): a cache feeds the prompt once and then one token per "
            "step; this path does far more work than that, whatever its cache-free path costs."
        )

    def work_workload(self) -> dict[str, Workload]:
        """The work probe's cached runs as a workload of the yardstick (its rounds)."""
        bench = load_thresholds(self.ctx.device)[self.part]
        rounds = {**bench, "warmup": 0, "repeats": WORK_REFERENCE_ROUNDS}
        return {"work": (lambda _, i: self.work_run(True, i), [WITH], rounds)}

    def pool(self, key: str) -> dict[str, Any] | None:
        """The hidden prompt pool ``key`` (e.g. "1000x20", "work"), or None without it: a
        stored one, or one the reference built for this grading (a GPU workload's)."""
        pool = self.meta().get("bench_pools", {}).get(key)
        if pool is None:
            pool = pools_built(self.ctx, self.part).get(key)
        if isinstance(pool, str):  # the reference could not build it: why
            self.fail(pool_fault(pool))
        return pool if isinstance(pool, dict) and pool.get("prompts") else None

    def require_pool(self, bench: dict[str, Any], key: str) -> None:
        """A profile whose benchmark model has sizes of its own has no stored pool: without
        the one the reference builds in the grading, nothing can be timed."""
        if "model" in bench and self.pool(key) is None:
            self.fail(
                "Grader fault, not yours: this profile's benchmark model has no prompts to "
                "time (its pool is built by the reference when the grading starts). Tell "
                "your TA."
            )

    def reserve(self, key: str, rows: int) -> tuple[dict[str, Any] | None, slice]:
        """Pool ``key`` and the slice of its next ``rows`` unused prompts (the pool is None
        without the hidden cases). No prompt is used twice in a grading."""
        used = self.ctx.scratch.setdefault(f"{self.part}.pool_used.{key}", [0])
        first = used[0]
        used[0] += rows
        pool = self.pool(key)
        if pool is not None and first + rows > len(pool["prompts"]):
            self.fail(
                f"Grader fault: the timed runs used up the {len(pool['prompts'])} prompts of "
                f"pool {key!r}; run `python -m grader regen` after changing thresholds.toml."
            )
        return pool, slice(first, first + rows)

    def interleaved_work(
        self,
        rounds: int,
        run: Callable[[bool, int], Sample],
        threshold: float | None = None,
    ) -> tuple[Ratio, dict[str, Timing]]:
        """``run(use_cache, round)`` without then with the cache, up to ``rounds`` times,
        and the ratio of their CPU times (cache-free over cached) as the grader measured
        them. With a ``threshold``, rounds stop once the ratio so far is :func:`decided`:
        more rounds only matter near the line."""
        runs: dict[str, list[Sample]] = {WITHOUT: [], WITH: []}
        for i in range(rounds):
            for variant, use_cache in ((WITHOUT, False), (WITH, True)):
                runs[variant].append(run(use_cache, i))
            if threshold is not None and decided(self._ratio(runs), threshold):
                break
        return self._ratio(runs), {v: Timing(tuple(s)) for v, s in runs.items()}

    @staticmethod
    def cached_growth(
        rounds: int,
        run: Callable[[int, int], Sample],
        short: int,
        long: int,
        threshold: float | None = None,
        first_counts: bool = False,
    ) -> Ratio:
        """CPU seconds per generated token of the cached path alone, ``long`` new tokens
        over ``short`` ones: ``run(new_tokens, round)`` is one cached run, measured by the
        grader. A cache keeps it near 1; recomputing the prefix makes it grow with the
        length, however slow the submission makes its own cache-free path. With a
        ``threshold`` (at most), one round is measured first; unless it is :func:`decided`,
        ``rounds`` more are measured and they alone decide (a short
        run lasts a few of the kernel's clock ticks, so one round near the line is noise).
        With ``first_counts``, the first round is one of ``rounds`` and counts with the
        others: an undecided probe measures and judges exactly what it would without a
        threshold (its pool holds ``rounds`` rounds)."""
        per_token: dict[int, list[float]] = {short: [], long: []}

        def measure(first: int, count: int) -> Ratio:
            for i in range(first, first + count):
                for n in (short, long):
                    per_token[n].append(run(n, i).on("cpu") / n)
            return Ratio.between(per_token[long], per_token[short])

        if threshold is None:
            return measure(0, rounds)
        growth = measure(0, 1)
        if decided(growth, threshold, at_least=False):
            return growth
        if first_counts:
            return measure(1, rounds - 1)
        for runs in per_token.values():  # the undecided first round is left out
            runs.clear()
        return measure(1, rounds)

    @staticmethod
    def _ratio(runs: dict[str, list[Sample]]) -> Ratio:
        return Ratio.of(Timing(tuple(runs[WITHOUT])), Timing(tuple(runs[WITH])), "cpu")

    @staticmethod
    def report_work(
        ratio: Ratio, timings: dict[str, Timing], new: int, batch: int, prompt: int
    ) -> dict[str, float]:
        """Print the work probe's figures (shown with the check) and return the median
        CPU milliseconds of each variant."""
        cpu = {v: t.cpu_median * 1000 for v, t in timings.items()}
        print(
            f"Work probe ({new} new tokens after {batch} prompts of {prompt} tokens, CPU time "
            f"measured by the grader): without the cache {cpu[WITHOUT]:.0f} ms, with it "
            f"{cpu[WITH]:.0f} ms, ratio {ratio}."
        )
        return cpu
