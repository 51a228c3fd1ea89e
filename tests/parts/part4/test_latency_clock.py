"""Check 4.8 names the clock a lab's figures were read on, and where it was read: lab
variants the mutant library does not hold, each written as a student would write
measure_latency, graded. The adapter records the process's and the thread's CPU time
beside its wall clock, and the grader's waits in every run are sleeps (wall time, next
to no CPU time): figures of CPU time fit the one and not the other. A clock started once
before the runs makes each time the sum of the runs so far. A right lab keeps 4.8 on any
wall clock, a busy process included, and no mistake of another kind is told the clock."""

from __future__ import annotations

import hashlib
import os
import statistics
import threading
import time
from types import ModuleType

import numpy as np
import pytest

from grader.core.points import POINTS
from grader.parts.part4.latency import latency_figures
from grader.parts.part4.latency_clock import CLOCKED_CASES, generations_of
from grader.parts.part4.latency_isolate import EXPERIMENTS, Run, _timed, per_token
from grader.parts.part4.support import plain_value
from grader.ta.mutants import load_mutants
from tests.conftest import ROOT, grade_checks, library_edits, one_kept_quick, patched_solution

TIMED = """                start = time.perf_counter()
                generate(model, prompt, L)
                cuda_sync(device)
                if i >= warmup:
                    times.append(time.perf_counter() - start)"""
LOOP = """            times = []
            for i in range(warmup + repeats):
                cuda_sync(device)
"""
FIGURE = "result[key].append(statistics.median(times) * 1000 / L)"
IMPORTS = "import time\nfrom pathlib import Path\n"
BODY = "    gen = torch.Generator().manual_seed(0)\n"
END = FIGURE + "\n    return result\n"

#: A thread of the lab's own kept busy through measure_latency (a progress monitor that
#: never sleeps): the process's CPU time runs ahead of the wall clock, and the GIL it
#: holds stalls the generations, as a loaded machine does. On one core the process's CPU
#: time would keep pace with the wall clock instead (the thread runs through the grader's
#: waits): the tests that need it ahead are skipped there.
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
BUSY = [
    (IMPORTS, "import threading\n" + IMPORTS),
    (BODY, "    done = threading.Event()\n\n"
           "    def monitor():  # keeps the process busy while the lab runs\n"
           "        while not done.is_set():\n"
           "            sum(range(1000))\n\n"
           "    threading.Thread(target=monitor, daemon=True).start()\n" + BODY),
    (END, FIGURE + "\n    done.set()\n    return result\n"),
]  # fmt: skip

#: Each variant's edits of solution/kv_lab.py, and the one cause 4.8 must name.
MISTAKES: dict[str, tuple[list[tuple[str, str]], str]] = {
    # "process_time is the precise clock for benchmarks"
    "process_time": ([(TIMED, TIMED.replace("time.perf_counter()", "time.process_time()"))],
                     "isolated:latency_cpu_time"),
    # the thread's CPU time in nanoseconds, turned into ms at once
    "thread_time_ns_in_ms": ([
        (TIMED, "                t0 = time.thread_time_ns()\n"
                "                generate(model, prompt, L)\n"
                "                cuda_sync(device)\n"
                "                if i >= warmup:\n"
                "                    times.append((time.thread_time_ns() - t0) / 1e6)"),
        (FIGURE, "result[key].append(statistics.median(times) / L)")],
        "isolated:latency_cpu_time"),
    # a helper of its own around timeit, given the process's clock as its timer
    "timeit_helper_on_process_time": ([
        (IMPORTS, "import timeit\n" + IMPORTS),
        (TIMED, "                elapsed = _time_once(lambda: generate(model, prompt, L))\n"
                "                cuda_sync(device)\n"
                "                if i >= warmup:\n"
                "                    times.append(elapsed)"),
        ("def measure_latency(",
         "def _time_once(fn) -> float:\n"
         "    return timeit.timeit(fn, number=1, timer=time.process_time)\n\n\n"
         "def measure_latency(")],
        "isolated:latency_cpu_time"),
    # the process's clock imported under the name of the one the handout asks for
    "process_time_imported_as_perf_counter": ([
        (IMPORTS, "from time import process_time as perf_counter\n" + IMPORTS),
        (TIMED, TIMED.replace("time.perf_counter()", "perf_counter()"))],
        "isolated:latency_cpu_time"),
    # the clock started once before the loop of warm-up and timed runs
    "started_before_the_loop": ([
        (LOOP + TIMED, "            times = []\n"
                       "            start = time.perf_counter()\n"
                       "            for i in range(warmup + repeats):\n"
                       "                cuda_sync(device)\n"
                       "                generate(model, prompt, L)\n"
                       "                cuda_sync(device)\n"
                       "                if i >= warmup:\n"
                       "                    times.append(time.perf_counter() - start)")],
        "isolated:latency_clock_started_before_warmups"),
    # warm-ups in a loop of their own, then one start for every timed run
    "started_once_after_the_warmups": ([
        (LOOP + TIMED, "            for _ in range(warmup):\n"
                       "                generate(model, prompt, L)\n"
                       "            times = []\n"
                       "            cuda_sync(device)\n"
                       "            t_start = time.perf_counter()\n"
                       "            for _ in range(repeats):\n"
                       "                generate(model, prompt, L)\n"
                       "                cuda_sync(device)\n"
                       "                times.append(time.perf_counter() - t_start)")],
        "isolated:latency_clock_started_once"),
    # the process's clock in a busy process: its CPU time runs ahead of the thread's
    "process_time_busy": ([*BUSY, (TIMED, TIMED.replace("time.perf_counter()",
                                                       "time.process_time()"))],
                          "isolated:latency_cpu_time"),
    # wall time, but only the first timed run, in a busy process: never told the clock
    "first_run_only_busy": ([*BUSY, (FIGURE, "result[key].append(times[0] * 1000 / L)")],
                            "isolated:latency_first_run_only"),
}  # fmt: skip

#: What each cause's sentence says (and a variant's, where it says more).
SAYS = {
    "process_time_busy": "times with the process's CPU time (time.process_time: every thread's)",
    "isolated:latency_cpu_time": "times with CPU time (time.process_time or time.thread_time",
    "isolated:latency_clock_started_before_warmups": "reads the start of its clock once, "
    "before the warm-up runs",
    "isolated:latency_clock_started_once": "reads the start of its clock once, before the timed",
    "isolated:latency_first_run_only": "times only the first run",
}
EVIDENCE = {
    "isolated:latency_cpu_time": "Narrowed by experiment: the grader made every run wait 5 to "
    "47 ms asleep: wall time counts the wait, CPU time only what the process's threads ran "
    "meanwhile; every figure fits the",
    "isolated:latency_clock_started_before_warmups": "Narrowed by experiment: with warmup=2, "
    "repeats=5 it made 7 generations per L and mode, and each figure is the time from the "
    "start of the first warm-up",
    "isolated:latency_clock_started_once": "Narrowed by experiment: with warmup=2, repeats=5 it "
    "made 7 generations per L and mode, and each figure is the time from the start of its "
    "first timed run",
    "isolated:latency_first_run_only": "each figure is the first timed run alone",
}

#: Right labs: other wall clocks, and the handout's clock in a busy process.
RIGHT: dict[str, list[tuple[str, str]]] = {
    "monotonic_ns": [(TIMED, "                start = time.monotonic_ns()\n"
                             "                generate(model, prompt, L)\n"
                             "                cuda_sync(device)\n"
                             "                if i >= warmup:\n"
                             "                    elapsed = time.monotonic_ns() - start\n"
                             "                    times.append(elapsed * 1e-9)")],
    "perf_counter_ns_busy": [*BUSY, (TIMED, TIMED.replace("time.perf_counter()",
                                                          "time.perf_counter_ns() / 1e9"))],
}  # fmt: skip


def test_the_variants_are_not_in_the_mutant_library() -> None:
    library = library_edits("part4")
    for edits in [*(e for e, _ in MISTAKES.values()), *RIGHT.values()]:
        assert not set(edits) & library


@pytest.mark.parametrize(
    "name",
    one_kept_quick(sorted(MISTAKES), lambda n: [TWO_CORES] if n.endswith("_busy") else []),
)
def test_a_mistake_of_the_clock_is_named(tmp_path, name: str) -> None:
    edits, cause = MISTAKES[name]
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", edits)
    result = grade_checks(submission, tmp_path / "out", "part4", {"4.8"})
    test, output = result.test("4.8"), result.output("4.8")
    assert test["score"] < test["max_score"], output
    assert test["extra_data"].get("causes") == [cause], output
    assert SAYS.get(name, SAYS[cause]) in output, output
    assert EVIDENCE[cause] in output, output
    assert "They match" not in output, output  # the isolation decided
    if cause != "isolated:latency_cpu_time":
        assert "CPU time" not in output, output
    # a clock started before the warm-ups holds the one-off delay of 4.8's first call,
    # as a timed first run does: the isolation decides, the library's name is not said
    assert "times every run in measure_latency" not in output, output


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_a_right_lab_on_another_wall_clock_or_busy_keeps_4_8(tmp_path, name: str) -> None:
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", RIGHT[name])
    result = grade_checks(submission, tmp_path / "out", "part4", {"4.8"})
    assert result.score("4.8") == POINTS["part4"]["4.8"], result.output("4.8")
    assert not result.test("4.8").get("extra_data", {}).get("causes")


def test_the_librarys_timed_first_run_keeps_its_name_alone(tmp_path) -> None:
    """The library's latency_no_warmup holds the one-off delay in its figures, as a clock
    started before the warm-ups does: the isolating calls now decide between the two, and
    find no clock started once (its runs are its own), so the library's name stands alone."""
    [mutant] = [m for m in load_mutants("part4") if m.name == "latency_no_warmup"]
    submission = patched_solution(tmp_path / "submission", mutant.file, mutant.edits)
    result = grade_checks(submission, tmp_path / "out", "part4", {"4.8"})
    output = result.output("4.8")
    assert result.score("4.8") == 0, output
    assert result.test("4.8")["extra_data"].get("causes") == ["latency_no_warmup"], output
    assert mutant.diagnosis in output, output


# ------------------------------------------- the worker's record, on real clocks


class Model:
    """A model whose every call works ``work_s`` of CPU time in this thread."""

    work_s = 4e-4

    def forward(self, input_ids, **_):
        end = time.thread_time() + self.work_s
        while time.thread_time() < end:
            pass
        return input_ids

    def __call__(self, input_ids, **kwargs):
        return self.forward(input_ids, **kwargs)


def fake_lab(clock: str, busy: bool) -> ModuleType:
    """A lab of the handout's shape timing each generation on ``clock`` (a name in
    ``time``), with a thread of its own kept busy throughout where ``busy``."""
    lab = ModuleType("fake_lab")

    def generate(model, ids, L):
        for step in range(L):
            model(ids if step == 0 else np.zeros((1, 1 if cached else ids.shape[1] + step)))
        return ids

    def generate_no_cache(model, ids, L):
        nonlocal cached
        cached = False
        return generate(model, ids, L)

    def generate_with_cache(model, ids, L):
        nonlocal cached
        cached = True
        return generate(model, ids, L)

    def spin() -> None:  # hashing a large buffer lets go of the GIL: a second core's work
        while not done.is_set():
            hashlib.sha256(bytes(1 << 16)).digest()

    def measure_latency(model, L_values, prompt_len=8, warmup=1, repeats=3, device="cpu"):
        read = getattr(time, clock)
        if busy:
            threading.Thread(target=spin, daemon=True).start()
        ids, result = np.zeros((1, prompt_len)), {"L": list(L_values)}
        for key, name in (("no_cache_ms_per_token", "generate_no_cache"),
                          ("cache_ms_per_token", "generate_with_cache")):  # fmt: skip
            result[key] = []
            for L in L_values:
                times = []
                for i in range(warmup + repeats):
                    start = read()
                    getattr(lab, name)(model, ids, L)  # through the module's name
                    if i >= warmup:
                        times.append(read() - start)
                result[key].append(statistics.median(times) * 1000 / L)
        done.set()
        return result

    cached, done = False, threading.Event()
    lab.generate_no_cache, lab.generate_with_cache = generate_no_cache, generate_with_cache
    lab.measure_latency = measure_latency
    return lab


@pytest.mark.parametrize("busy", [False, pytest.param(True, marks=TWO_CORES)],
                         ids=["one thread", "busy thread"])  # fmt: skip
@pytest.mark.parametrize("clock", ["perf_counter", "process_time", "thread_time"])
def test_the_adapter_bounds_each_clocks_figures_on_real_clocks(monkeypatch, clock, busy):
    """The worker's record of a case, made on the real clocks: a lab's figures read on
    wall time fit the wall bounds, on CPU time the CPU bounds of the same clock, and
    never the other kind (the grader's waits are sleeps); a busy thread of the lab's
    sets the process's CPU time apart from the thread's."""
    from grader.parts.part4 import adapter_latency

    monkeypatch.syspath_prepend(str(ROOT / "grader" / "worker"))  # values.py, as in the worker
    case = EXPERIMENTS[0]
    out = adapter_latency.run_latency_timed(fake_lab(clock, busy), Model(), case.request())
    assert out["threads"] == 1
    figures, problem = latency_figures(plain_value(out["result"]), list(case.L_values))
    gens, unread = generations_of(out, case.settings["prompt_len"])
    assert not problem and not unread and gens
    run = Run(case, figures, gens)
    on = {"perf_counter": "wall", "process_time": "process", "thread_time": "thread"}[clock]
    assert run.fits(_timed, per_token, on)
    if on != "wall":
        assert not run.fits(_timed, per_token, "wall")
    else:
        assert not any(run.fits(_timed, per_token, c) for c in ("process", "thread"))
    if busy and on != "wall":  # the other CPU clock is apart: the spinner's time
        assert not run.fits(_timed, per_token, "thread" if on == "process" else "process")


def test_a_long_record_leaves_the_cpu_times_out(monkeypatch) -> None:
    """Past MAX_CPU_EVENTS the reply holds the wall clock's record alone (its header is
    bounded): no CPU bounds, nothing of the clock named, the wall bounds as before."""
    from grader.parts.part4 import adapter_latency

    monkeypatch.syspath_prepend(str(ROOT / "grader" / "worker"))
    monkeypatch.setattr(adapter_latency, "MAX_CPU_EVENTS", 10)
    case = CLOCKED_CASES[1]
    out = adapter_latency.run_latency_timed(fake_lab("process_time", False), Model(),
                                            case.request())  # fmt: skip
    assert "calls_cpu" not in out and "generations_cpu" not in out
    gens, unread = generations_of(out, case.settings["prompt_len"])
    assert gens and not unread and all(g.cpu is None and g.thread is None for g in gens)
