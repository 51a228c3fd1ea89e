"""Check 4.8's timed cases (grader/parts/part4/latency_clock.py) on a simulated lab: a
seeded timeline of generate calls and model calls, as the adapter records them (wall time,
and beside it the process's and the thread's CPU time), and the figures a lab reading any
wall clock around its runs would report, or one reading a CPU clock, or one reading its
clock in the wrong place. No clock is read: every time here is drawn from a seeded
generator.

Each right reading (any number of the lab's own untimed runs, before the loop over L or
inside it; the median or the mean; a quiet or a busy machine) is accepted, and each known
mistake is judged wrong and named."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field, fields

import pytest

from grader.parts.part4.latency_clock import (
    CLOCKED_CASES,
    ClockedCase,
    Generation,
    generations_of,
    timed_problem,
)

KEYS = {"no_cache": "no_cache_ms_per_token", "cache": "cache_ms_per_token"}


@dataclass
class Lab:
    """How the simulated lab runs and reads its runs: its own warm-ups (``before``
    generations of 4 tokens per mode before the loop, ``inside`` more at every L and
    mode), how many runs it makes and times, and what it reports."""

    before: int = 0
    inside: int = 0
    warmup: int | None = None  # None: the case's
    repeats: int | None = None
    average: object = statistics.median
    first_only: bool = False
    clock: str = "wall"  # or "process", "thread": CPU time, where the grader's waits are not
    unit: object = None  # figure = average x unit(L); None: ms per token
    whole_ms: bool = False
    rows: int = 1
    tokens: int | None = None  # the prompt's length; None: the case's
    busy: bool = False  # stalls of up to 30 ms anywhere: between runs and inside them
    by_calls: bool = False  # the generate functions reached another way than by name
    threads: float = 1.0  # the cores a model call keeps busy: process CPU time over thread
    started: str | None = None  # the clock's start read once: before the "timed" runs, or
    # before the loop with the "warmups"
    record_cpu: bool = True  # False: the reply of an adapter that records no CPU time


@dataclass
class Timeline:
    """The adapter's record, built as the simulated lab runs."""

    rng: random.Random
    busy: bool
    waits: tuple[float, ...]
    threads: float = 1.0
    now: float = 0.0
    cpu: float = 0.0  # the process's CPU time
    thread: float = 0.0  # the lab's thread's
    calls: list = field(default_factory=list)
    generations: list = field(default_factory=list)
    calls_cpu: list = field(default_factory=list)
    generations_cpu: list = field(default_factory=list)
    runs: dict = field(default_factory=lambda: {"no_cache": 0, "cache": 0})

    def pause(self, low: float, high: float, threads: float = 1.0) -> None:
        """Work of ``low`` to ``high`` seconds (``threads`` cores busy), and on a busy
        machine sometimes a stall on top, which no CPU clock of the lab's counts."""
        work = self.rng.uniform(low, high)
        self.now, self.thread, self.cpu = (
            self.now + work,
            self.thread + work,
            self.cpu + work * threads,
        )
        if self.busy and self.rng.random() < 0.2:
            self.now += self.rng.uniform(0.0, 0.03)  # another process had the core

    def sleep(self, seconds: float) -> None:
        """A wait: wall time, and next to no CPU time."""
        self.now, self.thread, self.cpu = self.now + seconds, self.thread + 1e-6, self.cpu + 1e-6

    def read(self, clock: str) -> float:
        return {"wall": self.now, "process": self.cpu, "thread": self.thread}[clock]

    def cpu_now(self) -> tuple[float, float]:
        return self.cpu, self.thread

    def generation(self, mode: str, L: int, rows: int, tokens: int, by_calls: bool) -> None:
        """One generate call, recorded as the adapter records it."""
        k = self.runs[mode]
        self.runs[mode] += 1
        wait = self.waits[(2 * k + (mode == "cache")) % len(self.waits)]
        index, t0, cpu0 = len(self.generations), self.now, self.cpu_now()
        self.pause(2e-6, 8e-6)
        if not by_calls:
            self.sleep(wait)
        for step in range(L):
            c0, on0 = self.now, self.cpu_now()
            self.pause(2e-4, 1e-3, self.threads)
            waited = wait if by_calls and step == 1 else 0.0
            self.sleep(waited)
            length = 1 if mode == "cache" and step else tokens + (0 if mode == "cache" else step)
            self.calls.append([c0, self.now, length, rows, waited, -1 if by_calls else index])
            self.calls_cpu.append([on0[0], self.cpu, on0[1], self.thread])
            self.pause(1e-5, 4e-5)  # argmax and cat between the calls
        if not by_calls:
            self.generations.append([mode, L, t0, self.now, rows, tokens, wait])
            self.generations_cpu.append([cpu0[0], self.cpu, cpu0[1], self.thread])


def run_lab(case: ClockedCase, lab: Lab, seed: int = 0) -> tuple[dict, dict[str, list[float]]]:
    """The adapter's reply for ``case`` run by ``lab``, and the figures the lab reports."""
    s = case.settings
    warmup = s["warmup"] if lab.warmup is None else lab.warmup
    repeats = s["repeats"] if lab.repeats is None else lab.repeats
    tokens = s["prompt_len"] if lab.tokens is None else lab.tokens
    line = Timeline(random.Random(seed), lab.busy, case.waits_s, lab.threads)
    generate = lambda mode, L: line.generation(mode, L, lab.rows, tokens, lab.by_calls)  # noqa: E731
    for _ in range(lab.before):
        for mode in KEYS:
            generate(mode, 4)
    figures: dict[str, list[float]] = {key: [] for key in KEYS.values()}
    for L in case.L_values:
        for mode, key in KEYS.items():
            for _ in range(lab.inside):
                generate(mode, L)
            times = []
            once = line.read(lab.clock) if lab.started == "warmups" else None
            for i in range(warmup + repeats):
                line.pause(5e-6, 4e-5)  # the loop, a cuda_sync
                start = line.read(lab.clock)
                if lab.started == "timed" and i == warmup:
                    once = start
                generate(mode, L)
                line.pause(5e-6, 4e-5)
                if i >= warmup:
                    times.append(line.read(lab.clock) - (start if once is None else once))
            kept = times[:1] if lab.first_only else times
            unit = lab.unit(L) if lab.unit else 1000 / L
            figure = lab.average(kept) * unit
            figures[key].append(float(math.floor(figure)) if lab.whole_ms else figure)
    line.pause(1e-5, 1e-4)
    reply = {"calls": line.calls, "generations": line.generations, "ended": line.now}
    if lab.record_cpu:
        reply |= {"calls_cpu": line.calls_cpu, "generations_cpu": line.generations_cpu,
                  "ended_cpu": list(line.cpu_now()), "threads": 1}  # fmt: skip
    return reply, figures


def judged(case: ClockedCase, lab: Lab, seed: int = 0) -> tuple[str, str | None]:
    reply, figures = run_lab(case, lab, seed)
    gens, unread = generations_of(reply, case.settings["prompt_len"])
    assert not unread and gens
    return timed_problem(case, figures, gens)


RIGHT = [
    Lab(),
    Lab(average=statistics.mean),  # the course lab's "average latency"
    Lab(before=2),  # two untimed runs per mode before the loop over L
    Lab(before=3, inside=1),  # and one more at every L: any number of its own
    Lab(inside=2, warmup=0),  # warm-ups of its own in place of the `warmup` runs
    Lab(before=1, warmup=0),  # one warm-up of its own for the whole call
    Lab(by_calls=True),  # generations found by their model calls
    Lab(by_calls=True, before=3, average=statistics.mean),
    Lab(busy=True, before=2),  # a busy machine widens the bounds, it never fails a lab
    Lab(busy=True, by_calls=True, inside=1),
]


def lab_id(lab: Lab) -> str:
    """A lab's test id: the fields it sets, a function by its name (a repr would carry the
    function's address, which differs between pytest-xdist's workers)."""
    values = ((f.name, getattr(lab, f.name), f.default) for f in fields(lab))
    shown = [f"{k}={getattr(v, '__name__', v)}" for k, v, default in values if v != default]
    return ",".join(shown) or "defaults"


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
@pytest.mark.parametrize("lab", RIGHT, ids=lab_id)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_right_reading_is_accepted(case: ClockedCase, lab: Lab, seed: int) -> None:
    assert judged(case, lab, seed) == ("", None)


@pytest.mark.parametrize("clock", ["wall", "process", "thread"])
@pytest.mark.parametrize("seed", range(20))
def test_any_clocks_reading_lies_within_its_generations_bounds(seed: int, clock: str) -> None:
    """The bounds hold each run's time whatever the load, on each clock: what the design
    rests on. The CPU clocks' bounds leave the waits out, so they lie apart from wall
    time's."""
    case = CLOCKED_CASES[0]
    lab = Lab(busy=True, before=seed % 3, repeats=1, warmup=0, by_calls=bool(seed % 2),
              clock=clock, threads=1.0 + seed % 4)  # fmt: skip
    reply, figures = run_lab(case, lab, seed)
    gens, _ = generations_of(reply, case.settings["prompt_len"])
    for key, mode in (("no_cache_ms_per_token", "no_cache"), ("cache_ms_per_token", "cache")):
        for L, figure in zip(case.L_values, figures[key], strict=True):
            [g] = [g for g in gens if g.mode == mode and g.L == L]
            low, high = g.bounds(clock)
            assert low <= figure * L / 1000 <= high
            assert g.waited_s >= 0.005  # every generation holds a wait of the grader's
            assert g.cpu[1] < g.low_s and g.thread[1] < g.low_s


@pytest.mark.parametrize(
    "change",
    [{"calls_cpu": []}, {"generations_cpu": [[0.0, "x", 0.0, 0.0]]}, {"ended_cpu": 1.0},
     {"threads": 2}],
    ids=["calls missing", "not a number", "no end", "two threads"],
)  # fmt: skip
def test_cpu_times_that_cannot_be_read_leave_the_wall_clock_alone(change: dict) -> None:
    """A CPU record that cannot be read gives no CPU bounds (the thread's none where two
    threads made events); the wall clock's bounds are the same."""
    case = CLOCKED_CASES[1]
    reply, _ = run_lab(case, Lab())
    gens, _ = generations_of(reply, case.settings["prompt_len"])
    changed, unread = generations_of({**reply, **change}, case.settings["prompt_len"])
    assert not unread
    assert [(g.low_s, g.high_s, g.span) for g in changed] == [(g.low_s, g.high_s, g.span)
                                                               for g in gens]  # fmt: skip
    assert all(g.thread is None for g in changed)
    assert all((g.cpu is None) == ("threads" not in change) for g in changed)


WRONG = {
    "first_only": (Lab(first_only=True), "keeping only the first timed run", None),
    "totals": (Lab(unit=lambda L: 1000.0), "not divided by L", "latency_totals"),
    "seconds": (Lab(unit=lambda L: 1 / L), "seconds per token", None),
    "whole_ms": (Lab(whole_ms=True), "rounded down to whole milliseconds", None),
    "cpu_time": (Lab(clock="process"), "the process's CPU time", None),
    "thread_time": (Lab(clock="thread", threads=3.0), "the process's CPU time", None),
    # an adapter that records no CPU time: the loose reading (the waits left out)
    "cpu_time_unrecorded": (Lab(clock="process", record_cpu=False), "the process's CPU time", None),
    "no_warmup": (Lab(warmup=0), "include the first generation it ran", "latency_no_warmup"),
    "two_rows": (Lab(rows=2), "a prompt of 2 rows", None),
    "other_prompt": (Lab(tokens=7), "a prompt of 7 tokens", None),
}


@pytest.mark.parametrize("case", CLOCKED_CASES, ids=lambda c: c.what)
@pytest.mark.parametrize("name", WRONG)
def test_known_mistakes_fail_and_are_told(case: ClockedCase, name: str) -> None:
    lab, told, catalogued = WRONG[name]
    for seed in range(3):
        problem, got = judged(case, lab, seed)
        assert told in problem, problem
        assert got == catalogued, (got, problem)


def test_a_loop_of_the_handouts_run_counts_written_in_is_short_of_runs() -> None:
    """1 + 3 runs where warmup = 2, repeats = 5 were passed: too few runs, named as the
    average of 3."""
    case = CLOCKED_CASES[0]
    problem, _ = judged(case, Lab(warmup=1, repeats=3))
    assert "generate_no_cache ran 4 times for that L, fewer than the repeats = 5" in problem
    assert "They match the average of the last 3 runs" in problem


@pytest.mark.parametrize("scale", [0.9, 1.1, 1.02])
def test_a_figure_off_by_a_little_is_wrong(scale: float) -> None:
    """The bounds are tens of microseconds apart on a quiet machine; every run is at least
    5 ms: a figure 2 % off is another number."""
    case = CLOCKED_CASES[1]
    reply, figures = run_lab(case, Lab())
    figures["cache_ms_per_token"][1] *= scale
    gens, _ = generations_of(reply, case.settings["prompt_len"])
    problem, _ = timed_problem(case, figures, gens)
    assert f"cache_ms_per_token at L = {case.L_values[1]} is" in problem


def test_suspect_defaults_are_pointed_at_and_nan_fails() -> None:
    case = CLOCKED_CASES[1]
    reply, figures = run_lab(case, Lab(repeats=2))
    gens, _ = generations_of(reply, case.settings["prompt_len"])
    problem, _ = timed_problem(case, figures, gens, defaults_only=True)
    assert "the defaults must be the handout's" in problem
    assert "They match the average of the last 2 runs" in problem
    nan = {k: [math.nan for _ in v] for k, v in figures.items()}
    assert timed_problem(case, nan, gens)[0]


@pytest.mark.parametrize(
    "reply",
    [{}, {"calls": [], "generations": [], "ended": "soon"},
     {"calls": [[0.0, "x", 8, 1, 0.0, -1]], "generations": [], "ended": 1.0},
     {"calls": [[0.0, 1.0]], "generations": [], "ended": 1.0}],
)  # fmt: skip
def test_a_record_that_cannot_be_read_is_said(reply: dict) -> None:
    gens, problem = generations_of(reply, 8)
    assert not gens and "could not be read" in problem


def test_model_calls_not_the_handouts_make_no_generation() -> None:
    """Found by their calls, a generation is the handout's: the prompt, then one token per
    call with the cache, one more each call without."""
    handout = [[0.0, 1.0, 8, 1, 0.0, -1], [1.0, 2.0, 1, 1, 0.0, -1], [2.0, 3.0, 1, 1, 0.0, -1]]
    whole = [[4.0, 5.0, 8, 1, 0.0, -1], [5.0, 6.0, 9, 1, 0.0, -1], [6.0, 7.0, 9, 1, 0.0, -1]]
    gens, _ = generations_of({"calls": handout + whole, "generations": [], "ended": 8.0}, 8)
    assert [(g.mode, g.L) for g in gens] == [("cache", 3)]
    # earliest start read, began, ended, latest stop read; no CPU time recorded
    assert gens[0] == Generation("cache", 3, 1, 8, 3.0, 4.0, 0.0, True, (0.0, 0.0, 3.0, 4.0))
