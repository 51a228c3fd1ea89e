"""Check 4.8's diagnosis by isolation (grader/parts/part4/latency_isolate.py) on lab
variants the mutant library does not hold, each written as a student would write
measure_latency: graded, each failing 4.8 names the one cause the isolating calls
single out (warmup or repeats varied alone, the figures against their runs' times) and
none of the library's. On the simulated lab, the clock too (CPU time against wall time,
a clock started once); the graded mistakes of the clock are in test_latency_clock.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from grader.parts.part4.latency_clock import ClockedCase, generations_of
from grader.parts.part4.latency_isolate import EXPERIMENTS, Run, latency_causes
from tests.conftest import grade_checks, library_edits, patched_solution
from tests.parts.part4.test_latency_timed import RIGHT, Lab, lab_id, run_lab

LOOP = "for i in range(warmup + repeats):"
KEEP = "                if i >= warmup:\n                    times.append"
FIGURE = "result[key].append(statistics.median(times) * 1000 / L)"

#: Each variant's edits of solution/kv_lab.py, and the cause 4.8 must name alone.
VARIANTS: dict[str, tuple[list[tuple[str, str]], str]] = {
    # one warm-up written in: the loop's count ignores the argument
    "one_warmup_written_in": ([(LOOP, "for i in range(1 + repeats):")],
                              "isolated:latency_ignores_warmup"),
    # three timed runs written in
    "three_repeats_written_in": ([(LOOP, "for i in range(warmup + 3):")],
                                 "isolated:latency_ignores_repeats"),
    # one warm-up of its own before everything, then every run timed, the warm-ups too
    "warmups_timed": ([(KEEP, "                if True:\n                    times.append"),
                       ("    for L in L_values:\n        result",
                        "    generate_with_cache(model, prompt, 2)  # warm up once\n"
                        "    for L in L_values:\n        result")],
                      "isolated:latency_counts_warmup"),
    "first_timed_run_only": ([(FIGURE, "result[key].append(times[0] * 1000 / L)")],
                             "isolated:latency_first_run_only"),
    "seconds_per_token": ([(FIGURE, "result[key].append(statistics.median(times) / L)")],
                          "isolated:latency_seconds"),
    "microseconds": ([(FIGURE, "result[key].append(statistics.median(times) * 1e6 / L)")],
                     "isolated:latency_ms_times_1000"),
    "per_token_of_the_sequence": (
        [(FIGURE, "result[key].append(statistics.median(times) * 1000 / (L + prompt_len))")],
        "isolated:latency_whole_sequence"),
    "sum_of_the_runs": ([(FIGURE, "result[key].append(sum(times) * 1000 / L)")],
                        "isolated:latency_sum_of_runs"),
}  # fmt: skip

#: What each isolated cause's sentence says.
SAYS = {
    "isolated:latency_ignores_warmup": "ignores its warmup argument: with warmup=0 and warmup=2",
    "isolated:latency_ignores_repeats": "ignores its repeats argument: with repeats=2 and",
    "isolated:latency_counts_warmup": "counts its warm-up runs in the figures",
    "isolated:latency_first_run_only": "times only the first run",
    "isolated:latency_seconds": "seconds per token",
    "isolated:latency_ms_times_1000": "by 1000 once more",
    "isolated:latency_whole_sequence": "divides by L + prompt_len",
    "isolated:latency_sum_of_runs": "adds the timed runs up",
}


def test_the_variants_are_not_in_the_mutant_library() -> None:
    library = library_edits("part4")
    for edits, _ in VARIANTS.values():
        assert not set(edits) & library


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_latency_mistake_nobody_listed_is_named_by_isolation(tmp_path, name: str) -> None:
    edits, cause = VARIANTS[name]
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", edits)
    result = grade_checks(submission, tmp_path / "out", "part4", {"4.8"})
    test = result.test("4.8")
    assert test["score"] < test["max_score"], result.output("4.8")
    assert test["extra_data"].get("causes") == [cause], result.output("4.8")
    assert SAYS[cause] in result.output("4.8"), result.output("4.8")
    # what one call's figures happen to equal (the CPU clock's loose bounds) gives way
    assert "They match" not in result.output("4.8"), result.output("4.8")


# ------------------------------------------------------------ on the simulated lab


def isolated(lab, cases=EXPERIMENTS, seed: int = 0) -> list[str]:
    """The causes the isolation names for ``lab`` run by the simulator of
    test_latency_timed.py on ``cases`` (the isolating calls, by default)."""
    runs = {}
    for case in cases:
        reply, figures = run_lab(case, lab, seed)
        gens, unread = generations_of(reply, case.settings["prompt_len"])
        assert gens and not unread
        runs[case.what] = Run(case, figures, gens)
    return [c.id for c in latency_causes(runs)]


@pytest.mark.parametrize("lab", RIGHT, ids=lab_id)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_right_reading_gets_no_cause(lab: Lab, seed: int) -> None:
    """Any number of the lab's own untimed runs (a warmup it ignores included), the
    median or the mean, a busy machine: nothing to name."""
    assert isolated(lab, seed=seed) == []


SIMULATED = {
    "first_only": (Lab(first_only=True), ["isolated:latency_first_run_only"]),
    "seconds": (Lab(unit=lambda L: 1 / L), ["isolated:latency_seconds"]),
    "totals": (Lab(unit=lambda L: 1000.0), ["isolated:latency_per_run_total"]),
    # the library's latency_no_warmup: its figures are its runs' own, the first included
    "no_warmup": (Lab(warmup=0), []),
    "repeats_ignored": (Lab(repeats=3), ["isolated:latency_ignores_repeats"]),
    # the clock: CPU time (one thread: the process's and the thread's agree, both fit)
    "cpu_time": (Lab(clock="process"), ["isolated:latency_cpu_time"]),
    "thread_time_of_many": (Lab(clock="thread", threads=3.0), ["isolated:latency_cpu_time"]),
    "process_time_of_many": (
        Lab(clock="process", threads=3.0, busy=True),
        ["isolated:latency_cpu_time"],
    ),
    "cpu_time_in_seconds": (
        Lab(clock="process", unit=lambda L: 1 / L),
        ["isolated:latency_cpu_time", "isolated:latency_seconds"],
    ),
    # ... an adapter that records no CPU time cannot tell
    "cpu_time_unrecorded": (Lab(clock="process", record_cpu=False), []),
    # where the clock is read: its start once, before the timed runs or the warm-ups
    "started_once": (Lab(started="timed"), ["isolated:latency_clock_started_once"]),
    "started_before_warmups": (
        Lab(started="warmups"),
        ["isolated:latency_clock_started_before_warmups"],
    ),
    "started_once_busy": (
        Lab(started="timed", busy=True, before=1),
        ["isolated:latency_clock_started_once"],
    ),
    # mistakes of rounding, of the prompt: none of the isolation's causes
    "whole_ms": (Lab(whole_ms=True), []),
    "two_rows": (Lab(rows=2), []),
    "other_prompt": (Lab(tokens=7), []),
}


@pytest.mark.parametrize("name", SIMULATED)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_simulated_mistake_gets_its_cause_and_no_other(name: str, seed: int) -> None:
    lab, causes = SIMULATED[name]
    assert isolated(lab, seed=seed) == causes


def cause_texts(lab, seed: int = 0) -> dict[str, str]:
    runs = {}
    for case in EXPERIMENTS:
        reply, figures = run_lab(case, lab, seed)
        gens, _ = generations_of(reply, case.settings["prompt_len"])
        runs[case.what] = Run(case, figures, gens)
    return {c.id: f"{c.text} | {c.evidence}" for c in latency_causes(runs)}


@pytest.mark.parametrize(
    ("lab", "says"),
    [(Lab(clock="process", threads=3.0), "the process's CPU time (time.process_time"),
     (Lab(clock="thread", threads=3.0), "the thread's CPU time (time.thread_time)"),
     (Lab(clock="thread"), "CPU time (time.process_time or time.thread_time, which differ")],
)  # fmt: skip
def test_the_cpu_clock_is_named_where_the_threads_tell_it(lab: Lab, says: str) -> None:
    """With several threads at work the process's CPU time runs ahead of the thread's:
    the one clock that fits is named; with one thread both are, as candidates."""
    text = cause_texts(lab)["isolated:latency_cpu_time"]
    assert says in text, text
    assert "by their wall time between" in text  # what the figure would be on each clock


#: Wall-clock labs with a mistake of another kind (or none), on a busy machine whose
#: process runs several threads: never told the clock.
NOT_THE_CLOCK = [
    *((f"right {lab_id(lab)}", lab) for lab in RIGHT),
    *((name, replace(lab, busy=True, threads=4.0)) for name, (lab, _) in SIMULATED.items()
      if lab.clock == "wall"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "lab"), NOT_THE_CLOCK, ids=[n for n, _ in NOT_THE_CLOCK])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_wall_clock_lab_is_never_told_the_clock(name: str, lab: Lab, seed: int) -> None:
    assert "isolated:latency_cpu_time" not in isolated(lab, seed=seed)


def test_two_units_of_the_same_ratio_are_named_together_with_what_tells_them_apart() -> None:
    """At L = repeats = 5 a whole run's time is the sum of the runs' mean per token: one
    call cannot tell them apart, and both are named as candidates."""
    case = ClockedCase((5,), {"prompt_len": 6, "warmup": 2, "repeats": 5})
    runs = {}
    reply, figures = run_lab(case, Lab(unit=lambda L: 1000.0))
    gens, _ = generations_of(reply, 6)
    runs[case.what] = Run(case, figures, gens)
    [cause] = latency_causes(runs)
    assert cause.id == "isolated:latency_per_run_total+sum_of_runs"
    assert "a call with other L values tells them apart" in cause.text
