"""Check 4.8's diagnosis by isolation (grader/parts/part4/latency_isolate.py) on lab
variants the mutant library does not hold, each written as a student would write
measure_latency: graded, each failing 4.8 names the one cause the isolating calls
single out (warmup or repeats varied alone, the figures against their runs' times) and
none of the library's."""

from __future__ import annotations

import pytest

from grader.ta.mutants import load_mutants
from tests.conftest import grade_checks, patched_solution

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
    library = {(old, new) for m in load_mutants("part4") for old, new in m.edits}
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
