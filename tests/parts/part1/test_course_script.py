"""A course-style Part 1 script (prints its answers, defines none of the kit's functions)
is run in the worker and graded from what it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FAST_LIMITS, Graded, run_grade

SCRIPT = Path(__file__).parent / "data" / "course_script.py"


def grade_script(tmp_path: Path, edits: list[tuple[str, str]] = ()) -> Graded:
    """Grade Part 1 of a submission whose question1.py is the course-style script, edited."""
    text = SCRIPT.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "question1.py").write_text(text)
    return run_grade(submission, tmp_path / "out", parts=["part1"], limits=FAST_LIMITS)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Graded:
    return grade_script(tmp_path_factory.mktemp("course_script"))


#: The checks whose every asked answer a course script prints: graded on the write-up's
#: inputs only, as the course's TA grades them (other inputs need a call and are left out).
ANSWERED = ("1.1", "1.2", "1.3", "1.4", "1.5", "1.8", "1.9", "1.10")


def test_a_right_script_passes_the_checks_its_output_answers(graded: Graded) -> None:
    for number in ANSWERED:
        assert graded.test(number)["status"] == "passed", graded.output(number)
    assert "does not define `param_count`" not in graded.output("1.1")
    # What no script line answers (FLOPs and bytes it does not print, the plots, the
    # hidden random inputs) scores nothing and names the function to define.
    for number in ("1.6", "1.7", "1.12", "1.13"):
        assert graded.score(number) == 0
        assert "define `" in graded.output(number)


def test_the_write_ups_answers_are_read_and_other_inputs_name_the_function_to_define(
    graded: Graded,
) -> None:
    """1.1's LLaMA-3-8B count is read (its rounded count made exact by the printed weight
    bytes), so only the cases a script cannot answer fail, each naming its function."""
    output = graded.output("1.1")
    assert "param_count(LLaMA-3-8B)" not in output
    assert "Graded on the 1 input(s) the course asked about" in output
    assert "param_count(Llama-3.2-1B) cannot be graded from what a script prints" in output
    assert "define `param_count(spec)` in question1.py" in output
    one_gpu = graded.output("1.4")
    assert "LLaMA-3-8B, 80 GiB, context 1024" not in one_gpu
    assert "max_batch_size(spec, gpu_mem_bytes, context_len, tp=1)" in one_gpu
    tensor_parallel = graded.output("1.5")  # the write-up's X = 2 is printed, TP 4 and 8 not
    assert "max_batch_size(LLaMA-3-8B, TP = 4) is not printed" in tensor_parallel
    assert "0 of" in graded.output("1.12")


def test_a_known_mistake_in_the_printed_answers_is_named(tmp_path: Path) -> None:
    graded = grade_script(tmp_path, [("kv = 2 * L * K * head", "kv = 2 * L * Q * head")])
    output = graded.output("1.3")
    assert "kv_cache_bytes_per_request(LLaMA-3-8B, context 1024, fp16): your script printed" in (
        output
    )
    assert "counts every query head as a KV head" in output
    assert graded.score("1.10") == 0
    assert "kv_cache_per_request_gib" in graded.output("1.10")
    assert graded.score("1.8") == 1  # the intensities are still right


def test_an_answer_printed_twice_with_two_values_is_reported_as_ambiguous(
    tmp_path: Path,
) -> None:
    again = 'print(f"Max batch size possible: {batch + 1}")\n'
    heading = 'print("----- Question 1(b) Results -----")'
    graded = grade_script(tmp_path, [(heading, again + heading)])
    output = graded.output("1.4")
    assert "cannot be read unambiguously (it is printed with different values)" in output
    assert "define `max_batch_size(spec, gpu_mem_bytes, context_len, tp=1)`" in output
    assert graded.score("1.10") == 0
