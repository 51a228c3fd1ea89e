"""The shared timing harness: statistics, interleaving, ratios, criteria, the RSS sampler."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from grader.runtime.timing import (
    MIN_ROUNDS,
    STEADY_ROUNDS,
    BenchmarkRecord,
    Criterion,
    Measurement,
    Ratio,
    Sample,
    Timing,
    clock_for,
    interleaved,
    measure,
    round_length,
    until_steady,
)
from grader.runtime.usage import cpu_snapshot, cpu_used, rss_peak
from grader.runtime.verdicts import (
    MISSED,
    PASSED,
    early_decision,
    final_decision,
    verdict_settings,
)
from tests.conftest import SOLUTION


def timing(*seconds: float, peaks: tuple[int | None, ...] = ()) -> Timing:
    peaks = peaks or (None,) * len(seconds)
    return Timing(tuple(Sample(s, p) for s, p in zip(seconds, peaks, strict=True)))


def test_median_spread_and_peak() -> None:
    t = timing(1.0, 3.0, 2.0, peaks=(10, None, 30))
    assert t.median == 2.0
    assert t.spread == pytest.approx((3.0 - 1.0) / 2.0)
    assert t.peak_bytes == 30
    assert timing(1.0).peak_bytes is None


def test_interleaved_alternates_variants_and_drops_warmups() -> None:
    calls = []

    def run(variant: str, i: int) -> Sample:
        calls.append((variant, i))
        return Sample(seconds=10 * i + (1 if variant == "b" else 0))

    out = interleaved(run, ["a", "b"], warmup=2, repeats=3)
    assert calls == [(v, i) for i in range(5) for v in ("a", "b")]
    assert out["a"].seconds == [20, 30, 40]
    assert out["b"].seconds == [21, 31, 41]


def test_interleaved_rotates_the_order_when_asked() -> None:
    calls = []

    def run(variant: str, i: int) -> Sample:
        calls.append(variant)
        return Sample(seconds=1.0)

    out = interleaved(run, ["a", "b", "c"], warmup=1, repeats=3, rotate=True)
    assert "".join(calls) == "abc" + "bca" + "cab" + "abc"
    assert all(len(t.samples) == 3 for t in out.values())


def test_ratio_of_medians_with_paired_spread() -> None:
    plain, cached = timing(10.0, 12.0, 30.0), timing(1.0, 2.0, 3.0)
    r = Ratio.of(plain, cached)
    assert r.median == pytest.approx(12.0 / 2.0)
    assert (r.low, r.high) == (pytest.approx(6.0), pytest.approx(10.0))
    assert str(r) == "6.00x (runs 6.00-10.00x)"


def test_ratio_needs_equal_series() -> None:
    with pytest.raises(ValueError):
        Ratio.between([1.0, 2.0], [1.0])


@pytest.mark.parametrize(
    ("median", "limit", "at_least", "passed"),
    [(3.0, 3.0, True, True), (2.99, 3.0, True, False), (2.0, 2.0, False, True),
     (2.01, 2.0, False, False)],
)  # fmt: skip
def test_criterion_direction(median: float, limit: float, at_least: bool, passed: bool) -> None:
    c = Criterion("part2.min_speedup", "speedup", Ratio(median, median, median), limit, at_least)
    assert c.passed is passed
    assert ("NOT MET" in c.describe()) is not passed


def test_record_summary_is_plain_json() -> None:
    good = Criterion("a", "a", Ratio(4.0, 3.5, 4.5), 3.0, True)
    bad = Criterion("b", "b", Ratio(2.5, 2.4, 2.6), 2.0, False)
    record = BenchmarkRecord("2.11", "cpu", [good, bad], {"x": timing(1.0, 2.0)}, {"speedup": 4.0})
    assert not record.passed and record.failures() == [bad]
    data = json.loads(json.dumps(record.summary()))
    assert {k: data["criteria"][0]["ratio"][k] for k in ("median", "low", "high")} == {
        "median": 4.0, "low": 3.5, "high": 4.5
    }  # fmt: skip
    assert data["criteria"][1]["passed"] is False and data["undecided"] == []
    assert data["timings"]["x"]["runs_s"] == [1.0, 2.0]


def speedup_at_least(limit: float):
    """A judge: cache-free ("plain") over "cached" must reach ``limit``."""

    def judge(timings: dict[str, Timing]) -> list[Criterion]:
        return [
            Criterion("k", "speedup", Ratio.of(timings["plain"], timings["cached"]), limit, True)
        ]

    return judge


def scripted(times: dict[str, list[float]]):
    """A run that returns the next scripted time of each variant, and the calls it saw."""
    calls: list[tuple[str, int]] = []

    def run(variant: str, i: int) -> Sample:
        calls.append((variant, i))
        return Sample(times[variant].pop(0))

    return run, calls


def test_measure_stops_once_every_run_clears_the_limit() -> None:
    """A 9x speedup against 2x needed is decided after one timed round, before repeats."""
    run, calls = scripted({"plain": [9.0] * 10, "cached": [1.0] * 10})
    m = measure(run, ["plain", "cached"], warmup=1, repeats=3, judge=speedup_at_least(2.0),
                confirm_repeats=6)  # fmt: skip
    assert MIN_ROUNDS == 1 and len(calls) == 2 * 2 and m.extra_rounds == 0
    assert [(c.passed, c.decision, c.rounds) for c in m.criteria] == [(True, PASSED, 1)]


def test_measure_near_the_line_takes_more_rounds_than_a_clear_pass() -> None:
    """2.2x against 2x needed: the first round's bound still reaches under the line."""
    run, calls = scripted({"plain": [2.2] * 10, "cached": [1.0] * 10})
    m = measure(run, ["plain", "cached"], warmup=1, repeats=4, judge=speedup_at_least(2.0),
                confirm_repeats=6)  # fmt: skip
    (c,) = m.criteria
    assert 1 < c.rounds <= 4 and len(calls) == 2 * (1 + c.rounds) and c.passed
    assert m.extra_rounds == 0 and not c.late and c.bound[0] >= 2.0


def test_measure_stops_a_miss_far_below_the_line_without_confirming_it() -> None:
    """0.5x against 2x needed, in every one of min_miss_rounds rounds: decided."""
    least = verdict_settings().min_miss_rounds
    run, calls = scripted({"plain": [0.5] * 12, "cached": [1.0] * 12})
    m = measure(run, ["plain", "cached"], warmup=1, repeats=3, judge=speedup_at_least(2.0),
                confirm_repeats=6)  # fmt: skip
    assert len(calls) == 2 * (1 + least) and not m.criteria[0].passed
    assert m.criteria[0].decision == MISSED


def test_one_criterion_missed_decides_the_measurement() -> None:
    """A cache that does not cache: its cached runs at 5x the reference's against at most
    2x miss, and the check needs every criterion: the rounds stop there."""
    run, calls = scripted({"plain": [1.0] * 12, "cached": [1.0] * 12})

    def judge(timings: dict[str, Timing]) -> list[Criterion]:
        cached = timings["cached"]
        yardstick = Timing((Sample(0.2), Sample(0.21)))
        return [
            Criterion("s", "speedup", Ratio.of(timings["plain"], cached), 1.6, True),
            Criterion("r", "vs reference", Ratio.against(cached, yardstick), 2.0, False),
        ]

    m = measure(run, ["plain", "cached"], warmup=1, repeats=3, judge=judge, confirm_repeats=6)
    assert len(calls) == 2 * (1 + verdict_settings().min_miss_rounds) and m.extra_rounds == 0
    assert [c.passed for c in m.criteria] == [False, False]
    assert BenchmarkRecord("2.11", "cpu", m.criteria).undecided == []


def test_a_check_lost_by_what_its_runs_did_stops_the_rounds() -> None:
    """Runs that lose the check whatever they cost (a cache whose calls feed tokens again)
    stop after the first timed round, with its timings; without that, a speedup short of
    the line is timed until it is decided."""
    run, calls = scripted({"plain": [1.0] * 12, "cached": [0.6] * 12})  # 1.67x against 2x
    lost: list[str] = []

    def cached_run(variant: str, i: int) -> Sample:
        if variant == "cached":
            lost.append("fed again")  # what the run's own calls showed
        return run(variant, i)

    m = measure(cached_run, ["plain", "cached"], warmup=1, repeats=3,
                judge=speedup_at_least(2.0), confirm_repeats=6,
                decided_elsewhere=lambda: bool(lost))  # fmt: skip
    assert len(calls) == 2 * 2 and m.cut_short and m.extra_rounds == 0  # warm-up + 1 round
    assert len(m.timings["cached"].samples) == 1 and not m.criteria[0].passed
    assert m.criteria[0].decision == ""  # judged on its median: the check is lost anyway
    record = BenchmarkRecord(check="2.11", profile="cpu")
    record.add(m)
    assert record.cut_short and record.summary()["cut_short"]
    run, calls = scripted({"plain": [1.0] * 12, "cached": [0.6] * 12})
    m = measure(run, ["plain", "cached"], warmup=1, repeats=3, judge=speedup_at_least(2.0),
                confirm_repeats=6, decided_elsewhere=lambda: False)  # fmt: skip
    assert not m.cut_short and m.criteria[0].decision == MISSED


def test_a_nan_ratio_is_never_decided_early_and_never_passes() -> None:
    s = verdict_settings()
    nan = Ratio(math.nan, math.nan, math.nan, 3, None)
    assert early_decision(nan, 2.0, True, 10, None, s)[0] == ""
    assert final_decision(nan, 2.0, True, 0.05, s)[0] == MISSED
    assert not Criterion("k", "label", nan, 2.0, True).passed
    far = Ratio(3.0, 2.9, 3.1, 3, 0.02)
    assert early_decision(far, 2.0, True, MIN_ROUNDS, None, s)[0] == PASSED
    within = Ratio(1.0, 0.95, 1.05, 3, 0.02)  # at most 2x
    assert early_decision(within, 2.0, False, MIN_ROUNDS, None, s)[0] == PASSED


def test_measure_outvotes_a_burst_of_stalls_in_the_extra_rounds() -> None:
    # The cached runs of two of three rounds stalled by 0.3 s: their median misses 2x, the
    # best run does not, so the rounds go on until the median's bound clears the line.
    stalled = [0.05, 0.31, 0.32, 0.01] + [0.01] * 6  # warm-up, 3 timed, 6 more
    run, calls = scripted({"plain": [0.04] * 10, "cached": stalled})
    m = measure(run, ["plain", "cached"], warmup=1, repeats=3, judge=speedup_at_least(2.0),
                confirm_repeats=6)  # fmt: skip
    (c,) = m.criteria
    assert 0 < m.extra_rounds <= 6 and c.passed and c.late and c.decision == PASSED
    assert calls[-2:] == [("plain", 3 + m.extra_rounds), ("cached", 3 + m.extra_rounds)]
    assert c.ratio.median == pytest.approx(4.0)  # verdict on every timed round
    record = BenchmarkRecord("3.11", "cpu", [c])
    assert record.summary()["decided_late"] == ["speedup"] and not record.undecided


def test_measure_keeps_a_real_miss_and_can_be_switched_off() -> None:
    # A cache that does not cache: about 1x in every round, decided with or without the
    # extra rounds.
    times = {"plain": [0.04, 0.041, 0.039, 0.04] * 3, "cached": [0.04] * 12}
    for confirm in (6, 0):
        run, calls = scripted({k: list(v) for k, v in times.items()})
        m = measure(run, ["plain", "cached"], warmup=1, repeats=3,
                    judge=speedup_at_least(2.0), confirm_repeats=confirm)  # fmt: skip
        assert m.extra_rounds == 0 and len(calls) == 8 and not m.criteria[0].passed


def test_record_adds_measurements_and_reports_extra_rounds() -> None:
    record = BenchmarkRecord("3.11", "cpu")
    for name, extra in (("batch 1", 6), ("batch 8", 0), ("batch 16", 6)):
        c = Criterion(name, name, Ratio(3.0, 2.0, 4.0), 2.0, True)
        record.add(Measurement({name: timing(1.0)}, [c], extra))
    assert list(record.timings) == ["batch 1", "batch 8", "batch 16"] and len(record.criteria) == 3
    # rounds added to each missed run, as its run count shows: not summed over batch sizes
    assert json.loads(json.dumps(record.summary()))["extra_rounds"] == 6


def test_ratio_on_the_cpu_clock_uses_cpu_seconds() -> None:
    # Wall times say 1x (a busy machine), CPU times say 10x (the work done).
    plain = Timing((Sample(1.0, cpu_seconds=0.5), Sample(1.2, cpu_seconds=0.6)))
    cached = Timing((Sample(1.0, cpu_seconds=0.05), Sample(1.2, cpu_seconds=0.06)))
    assert Ratio.of(plain, cached).median == pytest.approx(1.0)
    assert Ratio.of(plain, cached, "cpu").median == pytest.approx(10.0)
    unread = Timing((Sample(2.0),))  # no CPU figure: the wall clock stands in
    assert unread.cpu_seconds == [2.0]
    assert clock_for("cpu") == "cpu" and clock_for("cuda") == "wall"


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_cpu_used_counts_busy_children_and_threads_that_ended() -> None:
    # A process that burns 0.3 s in a child it waits for, then 0.3 s in a thread that
    # ends: both are the process's work, whichever way it was spread.
    code = (
        "import subprocess, sys, threading, time\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.3)!r}])\n"
        f"t = threading.Thread(target=exec, args=({BURN.format(s=0.3)!r},))\n"
        "t.start(); t.join()\n"
        "print('done', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        before = cpu_snapshot(proc.pid)
        assert proc.stdout.readline().strip() == "done"
        after = cpu_snapshot(proc.pid)
        assert cpu_used(before, after) >= 0.55
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.needs_root(reason="needs root to give the process a group of its own")
def test_work_handed_to_a_daemon_outside_the_tree_is_counted_by_the_run_gid() -> None:
    # The worker double-forks a daemon (new session, re-parented to init) that does the
    # work while the worker itself waits: invisible in the process tree, not in its group.
    from grader.sandbox.sandbox import fresh_gid

    gid = fresh_gid()
    code = (
        "import os, sys, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        exec({BURN.format(s=0.4)!r})\n"
        "        os.write(w, b'x'); time.sleep(30)\n"
        "    os._exit(0)\n"
        "os.wait(); os.read(r, 1)\n"
        "print('done', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: (os.setgroups([]), os.setgid(gid)),
    )
    try:
        before_tree, before_run = cpu_snapshot(proc.pid), cpu_snapshot(proc.pid, run_gid=gid)
        assert proc.stdout.readline().strip() == "done"
        after_tree, after_run = cpu_snapshot(proc.pid), cpu_snapshot(proc.pid, run_gid=gid)
        assert cpu_used(before_tree, after_tree) < 0.2  # the tree alone misses the daemon
        assert cpu_used(before_run, after_run) >= 0.35
    finally:
        proc.kill()
        proc.wait()
        from grader.sandbox.processes import kill_matching

        kill_matching(lambda p: p.info["gids"].real == gid, ["gids"])


#: A worker that hands its work to a grandchild: the middle process exits at once, so the
#: grandchild is an orphan; it burns CPU and exits before the worker answers. Reaped by
#: init, its CPU time would be charged to no one the grader can read.
GRANDCHILD = (
    "import os, time\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    if os.fork() == 0:\n"
    "        exec({burn!r})\n"
    "        os.write(w, b'x'); os._exit(0)\n"
    "    os._exit(0)\n"
    "os.wait(); os.read(r, 1); time.sleep(0.3)\n"
    "print('done', flush=True)\n"
    "time.sleep(30)\n"
)


def cpu_of_grandchild_work(subreaper: bool) -> float | None:
    """CPU time charged to a worker whose grandchild did 0.4 s of work and exited, with
    this process as the orphans' reaper or not (in a child, so the test runner's own
    process keeps its settings)."""
    code = (
        "import subprocess, sys\n"
        "from grader.runtime.usage import cpu_snapshot, cpu_used\n"
        "from grader.sandbox.processes import become_subreaper, reap_orphans\n"
        f"if {subreaper}: assert become_subreaper()\n"
        f"worker = {GRANDCHILD.format(burn=BURN.format(s=0.4))!r}\n"
        "proc = subprocess.Popen([sys.executable, '-c', worker], stdout=-1, text=True)\n"
        "before = cpu_snapshot(proc.pid)\n"
        "assert proc.stdout.readline().strip() == 'done'\n"
        "print(cpu_used(before, cpu_snapshot(proc.pid)))\n"
        "proc.kill(); proc.wait(); reap_orphans()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip())


def test_work_of_an_orphan_that_exited_is_counted_by_its_subreaper() -> None:
    assert cpu_of_grandchild_work(subreaper=False) < 0.2  # reaped by init: unseen
    assert cpu_of_grandchild_work(subreaper=True) >= 0.35


def test_a_grading_makes_the_grader_its_workers_orphans_reaper(tmp_path: Path) -> None:
    """Checked in a child process through prctl's PR_GET_CHILD_SUBREAPER: not a subreaper
    before a grading, one after (its worker client made it one)."""
    code = (
        "import ctypes\n"
        "from grader.grading.runner import grade\n"
        "libc = ctypes.CDLL(None); flag = ctypes.c_int(0)\n"
        "libc.prctl(37, ctypes.byref(flag), 0, 0, 0); before = flag.value\n"
        f"grade({str(SOLUTION)!r}, results_path={str(tmp_path / 'r.json')!r}, parts=['part1'])\n"
        "libc.prctl(37, ctypes.byref(flag), 0, 0, 0)\n"
        "print(before, flag.value)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == ["0", "1"], out.stdout + out.stderr


def test_cpu_used_never_shrinks_when_a_process_goes() -> None:
    # A descendant that ran before and is gone after adds nothing and subtracts nothing.
    before = {1: 5.0, 2: 100.0}
    after = {1: 5.5, 3: 0.25}
    assert cpu_used(before, after) == pytest.approx(0.75)
    assert cpu_used(None, after) is None
    assert cpu_snapshot(2**22 + 12345) is None  # no such process


#: Touches 96 MB of fresh pages on a line of input, holds them briefly, frees them, then
#: waits to be stopped.
ALLOCATING_CHILD = (
    "import sys, time\n"
    "sys.stdin.readline()\n"
    "b = bytearray(96 * 2**20)\n"
    "b[::4096] = b'x' * len(b[::4096])\n"
    "time.sleep(0.3)\n"
    "del b\n"
    "print('done', flush=True)\n"
    "sys.stdin.readline()\n"
)


def peak_growth_of_an_allocating_child(**sampling: Any) -> int:
    """How far :func:`rss_peak` (given ``sampling``) sees that child's RSS rise."""
    child = subprocess.Popen(
        [sys.executable, "-c", ALLOCATING_CHILD],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(0.2)
        with rss_peak(child.pid, **sampling) as rss:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
        return rss["peak"] - rss["start"]
    finally:
        child.kill()
        child.wait()


def test_rss_peak_sees_another_process_allocate() -> None:
    assert peak_growth_of_an_allocating_child() >= 64 * 2**20


def test_rss_peak_of_a_missing_process_is_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with rss_peak(child.pid) as rss:
        pass
    assert rss == {"start": 0, "peak": 0}


class FakeCuda:
    """Stands in for ``torch.cuda`` on a machine without a GPU: records what is called."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def reset_peak_memory_stats(self) -> None:
        self.calls.append("reset")

    def empty_cache(self) -> None:  # must not be called: see the test below
        self.calls.append("empty_cache")

    reserved = 0  # what PyTorch's allocator holds (memory_reserved)

    def max_memory_allocated(self) -> int:
        self.calls.append("peak")
        return 123_456

    def memory_reserved(self) -> int:
        return self.reserved


def test_worker_synchronises_cuda_around_a_timed_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from grader.ta.regen import import_path
    from tests.conftest import ROOT

    worker_dir = ROOT / "grader" / "worker"
    monkeypatch.syspath_prepend(str(worker_dir))
    main = import_path(worker_dir / "main.py", "worker_main_under_test")
    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    main.before_timed()
    assert cuda.calls == ["synchronize", "reset"]  # idle GPU, fresh statistics
    assert main.after_timed() == {"cuda_peak_bytes": 123_456}
    # Queued work finished before the reply; PyTorch's cached blocks are kept (handing
    # them back would put allocations inside every timed run).
    assert cuda.calls[2:] == ["synchronize", "peak"]
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())  # CPU-only torch
    assert main.after_timed() == {}


def test_a_ratio_against_another_process_runs_compares_medians_unpaired() -> None:
    """The reference's runs are not paired with the submission's (another worker, other
    rounds, another count): the medians are compared, each submission run for the spread;
    a yardstick without time gives NaN, which no criterion passes."""
    submission = Timing(tuple(Sample(s, cpu_seconds=c) for s, c in [(9, 3.0), (9, 6.0), (9, 4.0)]))
    reference = Timing((Sample(1, cpu_seconds=2.0), Sample(1, cpu_seconds=1.0)))
    ratio = Ratio.against(submission, reference, "cpu")
    assert (ratio.median, ratio.low, ratio.high) == (4.0 / 1.5, 3.0 / 1.5, 6.0 / 1.5)
    assert Ratio.against(submission, reference, "wall").median == 9.0
    empty = Ratio.against(submission, Timing((Sample(0.0, cpu_seconds=0.0),)), "cpu")
    assert math.isnan(empty.median)
    assert not Criterion("k", "over the reference's", empty, 1e9, False).passed
    assert not Criterion("k", "over the reference's", empty, 0.0, True).passed


def test_a_warm_up_run_generates_its_share_of_the_new_tokens() -> None:
    quarter = {"warmup": 1, "warmup_share": 4}
    assert [round_length(n, quarter, 0) for n in (1, 2, 7, 16, 20, 256)] == [1, 2, 2, 4, 5, 64]
    assert round_length(256, quarter, 1) == 256  # a timed round: all of them
    assert round_length(256, {"warmup": 1}, 0) == 256  # no share set (the cuda profile)


def test_the_cpu_profile_warms_up_on_a_quarter_and_the_cuda_profile_on_whole_runs() -> None:
    from grader.core.thresholds import load_thresholds

    for part in ("part2", "part3", "part4"):
        assert load_thresholds("cpu")[part]["warmup_share"] == 4
        assert "warmup_share" not in load_thresholds("cuda")[part]


def test_the_yardstick_stops_once_its_runs_are_steady() -> None:
    """Steady runs: STEADY_ROUNDS after the warm-up; a scattered run: up to ``repeats``."""
    run, calls = scripted({"cached": [5.0] + [1.0] * 9})
    out = until_steady(run, ["cached"], warmup=1, repeats=5, clock="wall")
    assert len(calls) == 1 + STEADY_ROUNDS and len(out["cached"].samples) == STEADY_ROUNDS
    run, calls = scripted({"cached": [5.0, 1.0, 2.0, 1.0, 1.5, 1.0]})
    out = until_steady(run, ["cached"], warmup=1, repeats=5, clock="wall")
    assert len(calls) == 6 and len(out["cached"].samples) == 5


@pytest.mark.parametrize(("reserved", "released"), [(2 * 123_456, False), (2 * 123_456 + 1, True)])
def test_worker_hands_back_cached_gpu_blocks_past_twice_its_peak(
    monkeypatch: pytest.MonkeyPatch, reserved: int, released: bool
) -> None:
    """After a reply, a worker whose cached blocks exceed twice the request's peak hands
    them back (a cache-free run's scores, a new size each step, filled an H200); a run
    that needs its blocks again keeps them."""
    import types

    from grader.ta.regen import import_path
    from tests.conftest import ROOT

    worker_dir = ROOT / "grader" / "worker"
    monkeypatch.syspath_prepend(str(worker_dir))
    main = import_path(worker_dir / "main.py", "worker_main_release")
    cuda = FakeCuda()
    cuda.reserved = reserved
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    main.release_cached()
    assert ("empty_cache" in cuda.calls) is released
