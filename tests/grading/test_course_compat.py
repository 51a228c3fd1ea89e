"""Course compatibility of Part 2: the public data has the course's weight layout, a
submission written against the course's own skeleton (its harness inside the file,
``generate`` returning only the new tokens) gets full marks and runs its harness on
the kit's public files, and its usual cached-path bugs cost only the checks they break,
with the mistake named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from grader.core.points import POINTS
from grader.parts.part2.adapter import state_dict_problem
from grader.ta.mutants import load_mutants
from tests.conftest import PART2_LIMITS, ROOT, Graded, run_grade

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("course_compat")

COURSE_STYLE = ROOT / "tests" / "submissions" / "course_style"
FILE = "transformer_skeleton.py"
PUBLIC_DATA = ROOT / "test_cases" / "public" / "part2"


def course_state_dict_table() -> dict[str, tuple[int, ...]]:
    """The keys and shapes of the course's model_state_dict.pt, as the issue lists them."""
    table: dict[str, tuple[int, ...]] = {
        "token_embedding.weight": (1000, 50),
        "pos_embedding.weight": (128, 50),
        "norm.weight": (50,),
        "norm.bias": (50,),
        "output_projection.weight": (1000, 50),
        "output_projection.bias": (1000,),
    }
    for i in (0, 1):
        layer = f"layers.{i}"
        for name in ("W_q", "W_k", "W_v", "W_o"):
            table[f"{layer}.attention.{name}.weight"] = (50, 50)
        table[f"{layer}.feed_forward.fc1.weight"] = (100, 50)
        table[f"{layer}.feed_forward.fc1.bias"] = (100,)
        table[f"{layer}.feed_forward.fc2.weight"] = (50, 100)
        table[f"{layer}.feed_forward.fc2.bias"] = (50,)
        for norm in ("norm1", "norm2"):
            table[f"{layer}.{norm}.weight"] = (50,)
            table[f"{layer}.{norm}.bias"] = (50,)
    return table


def test_public_weight_file_has_the_course_layout() -> None:
    stored = torch.load(PUBLIC_DATA / "model_state_dict.pt", map_location="cpu", weights_only=True)
    assert {k: tuple(v.shape) for k, v in stored.items()} == course_state_dict_table()
    assert not any(".attention." in k and k.endswith(".bias") for k in stored)


def test_public_cases_fit_the_course_model() -> None:
    cases = json.loads((PUBLIC_DATA / "test_cases.json").read_text())
    assert len(cases) == 10
    for case in cases:
        length = len(case["input_ids"][0])
        assert length <= 128
        for key in ("no_cache", "with_cache", "sequential"):
            logits = torch.tensor(case[f"expected_logits_{key}"])
            assert logits.shape == (1, length, 1000)


def test_load_message_names_extra_and_missing_keys() -> None:
    given = {"a.weight": torch.zeros(2), "b.weight": torch.zeros(2)}
    own = {
        "a.weight": torch.zeros(2),
        "layers.0.attention.W_o.bias": torch.zeros(2),
        "layers.1.attention.W_o.bias": torch.zeros(2),
    }
    problem = state_dict_problem(own, given)
    assert "no parameter b.weight" in problem
    assert "2 parameter(s)" in problem
    assert "layers.0.attention.W_o.bias, layers.1.attention.W_o.bias" in problem
    assert "W_q, W_k, W_v and W_o have no bias" in problem
    assert "have no bias" not in state_dict_problem({**given, "c.weight": 0}, given)


#: Each bug as the course-style file would have it: its edit, the checks it must fail
#: (every other check keeps full marks) and the library mutant whose diagnosis names it.
#: A wrong cached forward loses the cached-logits checks, and the checks whose points need
#: the cached path's answers to be the reference's (2.9's work probe, 2.11's timed runs).
CACHED_PATH_CHECKS = {"2.4", "2.5", "2.7", "2.8", "2.9", "2.11"}
BUGS: dict[str, tuple[tuple[str, str], set[str], str]] = {
    "mask_not_offset": (
        ("diagonal=T_k - T_q + 1)", "diagonal=1)"),
        CACHED_PATH_CHECKS,
        "mask_not_offset",
    ),
    "positions_not_offset": (
        ("torch.arange(past_len, past_len + T,", "torch.arange(0, T,"),
        CACHED_PATH_CHECKS,
        "positions_not_offset",
    ),
    "sequence_refed_on_the_cache": (
        ("step_input = generated[:, -1:]", "step_input = generated"),
        {"2.8", "2.9", "2.10", "2.11"},
        "generate_refeeds_with_cache",
    ),
}


# ----------------------------------------------------------------- the course harness


def course_copy(dest: Path, edits: Sequence[tuple[str, str]] = ()) -> Path:
    """The course-style submission in ``dest``, with ``(old, new)`` edits applied."""
    dest.mkdir(parents=True, exist_ok=True)
    text = (COURSE_STYLE / FILE).read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"edit anchor {old!r} must occur exactly once"
        text = text.replace(old, new)
    (dest / FILE).write_text(text)
    return dest


def run_course_harness(folder: Path, mode: str) -> subprocess.CompletedProcess[str]:
    """The file's own harness, run as the course runs it: in a folder holding the public
    ``model_state_dict.pt`` and ``test_cases.json``."""
    for name in ("model_state_dict.pt", "test_cases.json"):
        shutil.copy(PUBLIC_DATA / name, folder / name)
    return subprocess.run(
        [sys.executable, FILE, "--mode", mode],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("mode", ["evaluate", "kv_evaluate"])
def test_course_harness_passes_on_the_public_data(tmp_path: Path, mode: str) -> None:
    proc = run_course_harness(course_copy(tmp_path), mode)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Weights match for layer 0 Wq: True" in proc.stdout
    assert "Pass rate: 100.00% (10/10)" in proc.stdout


def test_course_harness_benchmark_runs_within_max_seq_len(tmp_path: Path) -> None:
    proc = run_course_harness(course_copy(tmp_path), "benchmark")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Skipping seq_len 500 as it exceeds max_seq_len (128)" in proc.stdout
    rows = json.loads((tmp_path / "benchmark_results.json").read_text())
    assert [r["seq_len"] for r in rows] == [10, 50, 100]


def test_course_harness_sees_a_cached_path_bug(tmp_path: Path) -> None:
    folder = course_copy(tmp_path, [BUGS["mask_not_offset"][0]])
    assert run_course_harness(folder, "evaluate").returncode == 0
    proc = run_course_harness(folder, "kv_evaluate")
    assert proc.returncode == 1
    assert "All tests passed: False" in proc.stdout


# ------------------------------------------------------------------------- grading


def grade_course_style(out: Path, edits: Sequence[tuple[str, str]] = ()) -> Graded:
    submission = course_copy(out / "submission", edits)
    return run_grade(submission, out / "results", parts=["part2"], limits=PART2_LIMITS)


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def course_graded(tmp_path_factory: pytest.TempPathFactory) -> Graded:
    return grade_course_style(tmp_path_factory.mktemp("course_style"))


def test_course_style_submission_gets_full_marks(course_graded: Graded) -> None:
    tests = course_graded.part_tests("part2")
    assert {t["number"] for t in tests} == set(POINTS["part2"])
    assert [t["number"] for t in tests if t["status"] != "passed"] == []
    assert course_graded.part_score("part2") == 30


def test_feedback_says_generate_returned_only_the_new_tokens(course_graded: Graded) -> None:
    assert "returns only the new tokens, (B, n)" in course_graded.output("2.8")


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_course_style_bug_loses_only_its_checks(tmp_path: Path, bug: str) -> None:
    edit, broken, mutant_name = BUGS[bug]
    graded = grade_course_style(tmp_path, [edit])
    tests = graded.part_tests("part2")
    assert {t["number"] for t in tests if t["status"] != "passed"} == broken
    for t in tests:
        if t["number"] not in broken:
            assert t["score"] == POINTS["part2"][t["number"]], t["number"]
    diagnosis = next(m.diagnosis for m in load_mutants("part2") if m.name == mutant_name)
    feedback = "\n".join(graded.output(n) for n in broken)
    assert diagnosis in feedback
    print(f"{bug}: {graded.part_score('part2')} / 30")
