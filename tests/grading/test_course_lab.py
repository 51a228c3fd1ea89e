"""Part 4 on lab scripts written as the course's lab handout writes them
(tests/submissions/course_lab_a/ and course_lab_b/, in this assignment's signatures):
each loses exactly the checks its real mistakes cost, and the feedback names them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import (
    EXPERIMENT_CELLS,
    ROOT,
    Graded,
    built_once,
    grade_checks,
    load_graded,
    notebook_from_script,
    run_grade,
)

# One pytest-xdist worker grades both scripts.
pytestmark = pytest.mark.xdist_group("course_lab")

SUBMISSIONS = ROOT / "tests" / "submissions"


def graded_lab(factory: pytest.TempPathFactory, worker_id: str, name: str) -> Graded:
    def build(out: Path) -> None:
        run_grade(SUBMISSIONS / name, out, parts=["part4"])

    return load_graded(built_once(factory, worker_id, name, build))


@pytest.fixture(scope="module")
def lab_a(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Graded:
    return graded_lab(tmp_path_factory, worker_id, "course_lab_a")


@pytest.fixture(scope="module")
def lab_b(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Graded:
    return graded_lab(tmp_path_factory, worker_id, "course_lab_b")


def lost(graded: Graded) -> set[str]:
    return {t["number"] for t in graded.part_tests("part4") if t["score"] < t["max_score"]}


def test_the_labs_own_habits_cost_nothing(lab_a: Graded) -> None:
    # time.time(), the mean of the repeats, an untimed warm-up pass before the loop.
    assert lab_a.score("4.8") == 2
    assert lost(lab_a) == {"4.5"}


def test_iterating_the_cache_as_pairs_is_named_not_a_bare_exception(lab_a: Graded) -> None:
    assert "This is the course lab's `for k, v in past_key_values`" in lab_a.output("4.5")
    # The bonus iterates every item of a layer: the None third one is named too.
    assert lab_a.score("4.7") == 0
    assert "sliding_window is None here" in lab_a.output("4.7")


def test_a_prefill_that_always_appends_a_token_is_caught(lab_b: Graded) -> None:
    assert 0 < lab_b.score("4.2") < 4
    assert "generate_with_cache(model, input_ids (1, 6), 0) returned shape (1, 7)" in lab_b.output(
        "4.2"
    )


def test_a_measure_latency_that_ignores_warmup_and_repeats_is_caught(lab_b: Graded) -> None:
    assert lab_b.score("4.8") == 0
    assert "the first (slow) one included" in lab_b.output("4.8")
    assert lost(lab_b) == {"4.2", "4.8"}


def test_the_course_lab_as_a_notebook_loses_what_the_script_loses(
    lab_a: Graded, tmp_path: Path
) -> None:
    """The course's lab handout accepts a notebook: lab A's script, cell by cell with its
    experiment cells after it, is graded as the script is, its real mistakes named."""
    upload = notebook_from_script(
        SUBMISSIONS / "course_lab_a" / "kv_lab.py", tmp_path / "upload", EXPERIMENT_CELLS
    )
    untimed = {t["number"] for t in lab_a.part_tests("part4")} - {"4.6"}
    graded = grade_checks(upload, tmp_path / "out", "part4", untimed)
    for number in untimed:
        assert graded.score(number) == lab_a.score(number), number
    assert lost(graded) == {"4.5"}
    assert "This is the course lab's `for k, v in past_key_values`" in graded.output("4.5")
    assert graded.results.extra_data["files"]["part4"]["converted"]
