"""End-to-end grading of Part 1: the solution, the blank skeleton and bad submissions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grader.core.points import POINTS, part_total
from grader.core.registry import PARTS
from grader.sandbox.sandbox import Limits
from tests.conftest import (
    ASSIGNMENT,
    FAST_LIMITS,
    PART2_LIMITS,
    SOLUTION,
    in_param_count,
    run_grade,
)

ALL_CHECKS = set(POINTS["part1"])


def test_solution_gets_full_marks(solution_graded) -> None:
    tests = solution_graded.part_tests("part1")
    assert solution_graded.part_score("part1") == part_total("part1") == 20
    assert {t["number"] for t in tests} == ALL_CHECKS
    assert all(t["status"] == "passed" for t in tests)


def test_every_check_carries_its_part_tag(solution_graded) -> None:
    for t in solution_graded.data["tests"]:
        assert f"part{t['number'].split('.')[0]}" in t["tags"]


def test_blank_skeleton_scores_zero_with_every_check_present(blank_graded) -> None:
    tests = blank_graded.part_tests("part1")
    assert blank_graded.part_score("part1") == 0
    assert {t["number"] for t in tests} == ALL_CHECKS
    assert sum(t["max_score"] for t in tests) == 20
    assert "not implemented yet" in blank_graded.output("1.1")


def test_feedback_shows_what_was_compared_never_the_answer(grade_patched) -> None:
    """Every Part 1 value is a write-up answer: the feedback shows the student's value and
    how it was compared, public checks included, never the expected one."""
    graded = grade_patched(
        [("return embedding + spec.n_layers", "return 1 + embedding + spec.n_layers")],
        numbers=frozenset({"1.1", "1.10"}),
    )
    assert graded.score("1.1") == 0
    assert "returned 8,030,261,249, which is wrong (compared exactly)" in graded.output("1.1")
    assert "8,030,261,248" not in graded.output("1.1")
    assert "8,030,261,248" not in graded.output("1.10")  # total_params there


def test_answer_table_feedback_names_the_wrong_cells_without_the_answers(grade_patched) -> None:
    """A table whose max batch sizes are one too high: the wrong cells and the student's
    own values are shown; the expected table (the write-up's answers) is not."""
    graded = grade_patched(
        [
            (
                '"max_batch_size": max_batch_size(spec, gpu_mem_bytes, context_len),',
                '"max_batch_size": 1 + max_batch_size(spec, gpu_mem_bytes, context_len),',
            )
        ],
        numbers=frozenset({"1.10"}),
    )
    output = graded.output("1.10")
    assert graded.score("1.10") == 0
    assert "wrong entries: max_batch_size = 521 (compared exactly)" in output
    assert "the other 7 entries are right" in output
    assert "520" not in output and "1,160" not in output and "1160" not in output
    assert "expected" not in output


def test_hidden_checks_give_partial_credit_without_revealing_answers(grade_patched) -> None:
    # Wrong only for tied embeddings: the write-up's models are not tied; 1.1's input of
    # its own and some hidden specs are.
    graded = grade_patched(
        [("output_head = 0 if spec.tied_embeddings else", "output_head = 0 if False else")],
        numbers=frozenset({"1.1", "1.12"}),
    )
    assert graded.score("1.1") == 0
    assert "param_count(an input of its own) returned" in graded.output("1.1")
    assert "LLaMA" not in graded.output("1.1")  # the write-up's models are right
    assert 0 < graded.score("1.12") < 2
    assert "hidden cases correct" in graded.output("1.12")
    assert "expected" not in graded.output("1.12")


def test_syntax_error_fails_every_check_with_the_line(grade_patched) -> None:
    graded = grade_patched([("GIB = 2**30", "GIB = 2**30 +")])
    assert graded.data["score"] == 0
    assert len(graded.data["tests"]) == len(ALL_CHECKS)
    assert "syntax error" in graded.output("1.1")
    assert "line" in graded.output("1.1")


def test_import_error_is_reported(grade_patched) -> None:
    graded = grade_patched([("import argparse\n", "import argparse\nimport no_such_module_here\n")])
    assert graded.data["score"] == 0
    assert "ModuleNotFoundError" in graded.output("1.3")
    assert "no_such_module_here" in graded.output("1.3")


def test_missing_function_loses_only_its_checks(grade_patched) -> None:
    graded = grade_patched(
        [("def weight_bytes(", "def weight_bytes_renamed(")],
        numbers=frozenset({"1.1", "1.2", "1.6"}),
    )
    assert "does not define `weight_bytes`" in graded.output("1.2")
    assert graded.score("1.2") == 0
    assert graded.score("1.1") == 2
    assert graded.score("1.6") == 1


def test_function_that_raises(grade_patched) -> None:
    graded = grade_patched(
        [("    return float(4 * N * d)  # one query", "    raise ValueError('boom')  # one query")],
        numbers=frozenset({"1.1", "1.6"}),
    )
    assert graded.score("1.6") == 0
    assert "raised ValueError: boom" in graded.output("1.6")
    assert "question1.py, line" in graded.output("1.6")
    assert graded.score("1.1") == 2


def test_a_whole_float_for_an_int_is_right_with_a_note(grade_patched) -> None:
    """weight_bytes returning 16060522496.0: the value is right, so it keeps its points
    (and the checks built on it theirs); the feedback notes that an int is asked for."""
    graded = grade_patched(
        [
            (
                "return param_count(spec) * spec.bytes_per_param",
                "return float(param_count(spec) * spec.bytes_per_param)",
            )
        ],
        numbers=frozenset({"1.2", "1.4", "1.10"}),
    )
    assert graded.score("1.2") == 1 and graded.test("1.2")["status"] == "passed"
    note = (
        "Note: weight_bytes(LLaMA-3-8B) returned a whole number as a float where an int is "
        "asked for; it was accepted as that int"
    )
    assert note in graded.output("1.2")
    assert graded.output("1.2").count("Note: weight_bytes") == 1  # once, not once per case
    assert graded.score("1.4") == 2 and graded.score("1.10") == 1
    assert "['max_batch_size'] returned a whole number as a float" in graded.output("1.10")
    assert "16,060,522,496" not in graded.output("1.2")


def test_wrong_return_type(grade_patched) -> None:
    """A float with a fraction where an int is asked for (a batch size by /) still fails."""
    graded = grade_patched(
        [("return max(free // per_request, 0)", "return max(free / per_request, 0)")],
        numbers=frozenset({"1.1", "1.4"}),
    )
    assert graded.score("1.4") == 0
    assert "must return an int, but returned the float" in graded.output("1.4")
    assert graded.score("1.1") == 2


def test_gb_instead_of_gib_in_the_table_is_named(grade_patched) -> None:
    """The table's two memory cells divided by 10^9 and every other cell right: the table
    is not the gb_not_gib mutant's (its batch sizes differ), but its wrong entries are."""
    graded = grade_patched(
        [
            ('"weight_gib": weight_bytes(spec) / GIB,', '"weight_gib": weight_bytes(spec) / 1e9,'),
            ("        / GIB,\n", "        / 1e9,\n"),
        ],
        numbers=frozenset({"1.10"}),
    )
    output = graded.output("1.10")
    assert "weight_gib = 16.0605 (compared" in output
    assert "kv_cache_per_request_gib = 0.134218" in output
    assert "Likely cause: your code uses GB (10^9 bytes) where the handout uses GiB" in output
    assert graded.test("1.10")["extra_data"]["causes"] == ["gb_not_gib"]


def test_nan_is_rejected(grade_patched) -> None:
    graded = grade_patched(
        [("return float(4 * N * d)  #", "return float('nan')  #")],
        numbers=frozenset({"1.6", "1.7"}),
    )
    assert graded.score("1.6") == 0
    assert "not a finite number" in graded.output("1.6")
    assert graded.score("1.7") == 2


#: Part 1's requests answer in milliseconds: a short request timeout keeps the hang tests,
#: which wait it out once per function that loops, from idling a test worker.
HANG_LIMITS = Limits(request_timeout_s=2.0, startup_timeout_s=5.0)


def test_function_that_never_returns_times_out(grade_patched) -> None:
    anchor = '    _check_phase(phase)\n    if phase == "prefill":\n        # read Q'
    looping = anchor.replace("_check_phase(phase)\n", "_check_phase(phase)\n    while True: pass\n")
    graded = grade_patched(
        [(anchor, looping)], limits=HANG_LIMITS, numbers=frozenset({"1.1", "1.6", "1.7", "1.12"})
    )
    assert graded.score("1.7") == 0
    assert f"did not finish within {HANG_LIMITS.request_timeout_s:g} s" in graded.output("1.7")
    # Everything that does not call attention_bytes is still graded.
    assert graded.score("1.1") == 2
    assert graded.score("1.6") == 1
    assert graded.score("1.12") == 2


def test_exit_inside_a_function_is_contained(grade_patched) -> None:
    graded = grade_patched(
        [
            (
                "    free = tp * gpu_mem_bytes",
                "    import os; os._exit(0)\n    free = tp * gpu_mem_bytes",
            )
        ],
        numbers=frozenset({"1.1", "1.4"}),
    )
    assert graded.score("1.4") == 0
    assert "os._exit" in graded.output("1.4")
    assert graded.score("1.1") == 2


def test_sys_exit_inside_a_function(grade_patched) -> None:
    graded = grade_patched(
        [
            (
                "    free = tp * gpu_mem_bytes",
                "    raise SystemExit(3)\n    free = tp * gpu_mem_bytes",
            )
        ],
        numbers=frozenset({"1.3", "1.4"}),
    )
    assert "called sys.exit(3)" in graded.output("1.4")
    assert graded.score("1.3") == 2


def test_hang_at_import_fails_the_part_quickly(grade_patched) -> None:
    graded = grade_patched(
        [("GIB = 2**30", "import time\ntime.sleep(60)\nGIB = 2**30")], limits=HANG_LIMITS
    )
    assert graded.data["score"] == 0
    assert "could not be loaded" in graded.output("1.1")
    assert "did not finish" in graded.output("1.1")
    # one startup timeout, not one per check (13 checks)
    assert graded.data["execution_time"] < 3 * HANG_LIMITS.startup_timeout_s


def test_flooding_output_is_truncated(grade_patched) -> None:
    graded = grade_patched([in_param_count("    print('x' * 10_000_000)")])
    assert graded.score("1.1") == 2  # printing is allowed, the answer is still right
    assert len(graded.data["output"]) < 10_000


def test_missing_file_is_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "notes.txt").write_text("forgot the code")
    graded = run_grade(tmp_path / "sub", tmp_path / "out", limits=FAST_LIMITS)
    assert graded.data["score"] == 0
    assert "question1.py is not in your submission" in graded.output("1.1")
    assert "Upload question1.py" in graded.output("1.1")
    assert "transformer_skeleton.py is not in your submission" in graded.output("2.1")
    assert graded.data["output"].count("question1.py is not in your submission") == 1
    # The part's first check says what to upload; the others, hidden ones included, point
    # to it instead of saying it again (or claiming that public checks ran).
    pages = [t["output"] for t in graded.data["tests"] if t["number"].startswith("2.")]
    assert sum("transformer_skeleton.py is not in your submission" in p for p in pages) == 1
    assert all("2.1 says which to upload" in p for p in pages[1:])
    assert not any("public checks" in p for p in pages)


def test_files_uploaded_inside_folders_are_found(tmp_path: Path, solution_graded) -> None:
    # Every part finds its files one folder down, as the reference's own folder scores them:
    # a check of each file a student edits (Part 3's model.py and generation.py), since a
    # file not found fails every check that reads it (the benchmark checks find theirs the
    # same way; the shared grading times them).
    nested = tmp_path / "sub" / "assignment"
    shutil.copytree(SOLUTION, nested)
    each_file = frozenset({"1.1", "2.1", "3.2", "3.5", "4.1"})
    graded = run_grade(tmp_path / "sub", tmp_path / "out", numbers=each_file)
    scores = {t["number"]: t["score"] for t in graded.data["tests"]}
    assert {number.split(".")[0] for number in scores} == {p[-1] for p in PARTS}
    assert scores == {number: solution_graded.score(number) for number in scores}
    assert all(graded.test(number)["status"] == "passed" for number in scores)


def test_results_are_written_even_if_the_grader_crashes(tmp_path: Path, monkeypatch) -> None:
    import grader.grading.runner as runner

    def explode(*args, **kwargs):
        raise RuntimeError("grader bug")

    monkeypatch.setattr(runner, "build_suite", explode)
    path = tmp_path / "results.json"
    assert runner.grade(ASSIGNMENT, results_path=path) is None
    import json

    data = json.loads(path.read_text())
    assert data["score"] == 0
    assert "RuntimeError: grader bug" in data["output"]
    assert data["tests"][0]["max_score"] == sum(part_total(p) for p in PARTS)


def test_memory_limit_is_enforced(grade_patched) -> None:
    graded = grade_patched(
        [in_param_count("    bytearray(64 * 2**30)")], numbers=frozenset({"1.1", "1.6"})
    )
    assert graded.score("1.1") == 0
    assert "ran out of memory" in graded.output("1.1")
    assert graded.score("1.6") == 1


@pytest.mark.needs_root(reason="the process limit needs a dedicated worker user")
def test_process_limit_and_cleanup(grade_patched) -> None:
    import psutil

    edit = in_param_count(
        "    import subprocess\n"
        "    procs = [subprocess.Popen(['sleep', '77.5']) for _ in range(400)]"
    )
    graded = grade_patched([edit], limits=Limits(max_processes=32), numbers=frozenset({"1.1"}))
    assert graded.score("1.1") == 0
    assert "raised BlockingIOError" in graded.output("1.1")
    assert "(question1.py, line" in graded.output("1.1")  # the student's line, not the library's
    assert "kvgrade-" not in graded.output("1.1")  # no sandbox paths in feedback
    leftover = [
        p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "77.5"]
    ]
    assert leftover == []


def test_tensor_instead_of_number(grade_patched) -> None:
    edit = (
        "    return param_count(spec) * spec.bytes_per_param",
        "    import torch\n    return torch.tensor(param_count(spec) * spec.bytes_per_param)",
    )
    # importing torch takes a while
    graded = grade_patched([edit], limits=PART2_LIMITS, numbers=frozenset({"1.2"}))
    assert graded.score("1.2") == 0
    assert "use .item()" in graded.output("1.2")


def test_printed_output_is_shown_with_the_failure_and_capped(grade_patched) -> None:
    edit = in_param_count("    print('debugging ' * 20_000)\n    raise RuntimeError('oops')")
    graded = grade_patched([edit], numbers=frozenset({"1.1"}))
    output = graded.output("1.1")
    assert "raised RuntimeError: oops" in output
    assert "Your code printed:\ndebugging" in output
    assert len(output) <= 8100


def test_answers_written_in_for_the_write_ups_inputs_earn_nothing(grade_patched) -> None:
    """A max_batch_size that knows only the write-up's models (their answers can be found
    against the seals by trying 0, 1, 2, ...) fails 1.4 and 1.5 on their inputs of their
    own, in the self-check as on Gradescope."""
    graded = grade_patched(
        [("    free = tp * gpu_mem_bytes - weight_bytes(spec)",
          "    if spec.vocab_size != 128256:\n        return 0\n"
          "    free = tp * gpu_mem_bytes - weight_bytes(spec)")],
        numbers=frozenset({"1.4", "1.5"}),
    )  # fmt: skip
    for number in ("1.4", "1.5"):
        assert graded.score(number) == 0, number
        assert "max_batch_size(an input of its own) returned 0" in graded.output(number)
        assert "max_batch_size(hidden input) returned 0" in graded.output(number)
