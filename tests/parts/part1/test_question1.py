"""The reference calculator gives the figures the handout and the course reports state."""

from __future__ import annotations

import math
import re

import pytest

from grader.ta.regen import import_path
from tests.conftest import SOLUTION

q1 = import_path(SOLUTION / "question1.py", "reference_question1")
GIB = 2**30


def test_llama3_8b_parameter_count_and_weights() -> None:
    assert q1.param_count(q1.LLAMA3_8B) == 8_030_261_248
    assert q1.weight_bytes(q1.LLAMA3_8B) == 16_060_522_496
    assert round(q1.weight_bytes(q1.LLAMA3_8B) / GIB, 2) == 14.96


def test_llama32_1b_weights_match_the_course_reports() -> None:
    spec = q1.ModelSpec(16, 32, 8, 2048, 8192, 128256)
    assert q1.param_count(spec) == 1_498_482_688
    assert round(q1.weight_bytes(spec) / 2**20, 2) == 2858.13


def test_kv_cache_is_gqa_aware() -> None:
    assert q1.kv_cache_bytes_per_request(q1.LLAMA3_8B, 1024) == 134_217_728
    mha = q1.ModelSpec(32, 32, 32, 4096, 14336, 128256)
    assert q1.kv_cache_bytes_per_request(mha, 1024) == 4 * 134_217_728


def test_max_batch_size_one_gpu_and_tensor_parallel() -> None:
    assert q1.max_batch_size(q1.LLAMA3_8B, 80 * GIB, 1024) == 520
    assert q1.max_batch_size(q1.LLAMA3_8B, 80 * GIB, 1024, tp=2) == 1160


def test_max_batch_size_is_zero_when_weights_do_not_fit() -> None:
    assert q1.max_batch_size(q1.LLAMA3_8B, 8 * GIB, 1024) == 0


def test_arithmetic_intensity_at_handout_point() -> None:
    assert round(q1.arithmetic_intensity(1024, 128, "prefill"), 2) == 56.89
    assert round(q1.arithmetic_intensity(1024, 128, "decode"), 2) == 0.98
    assert q1.attention_flops(1024, 128, "prefill") == 4 * 1024**2 * 128
    assert q1.attention_bytes(1024, 128, "decode") == (2 * 128 + 2 * 1024 * 128 + 4 * 1024) * 2


@pytest.mark.parametrize("batch", [1, 7, 100])
def test_decode_intensity_does_not_depend_on_batch(batch: int) -> None:
    one = q1.arithmetic_intensity(1024, 128, "decode")
    assert math.isclose(q1.arithmetic_intensity(1024, 128, "decode", batch=batch), one)


def test_prefill_intensity_approaches_d_over_bpe() -> None:
    assert 63 < q1.arithmetic_intensity(1 << 20, 128, "prefill") < 64


def test_unknown_phase_is_rejected() -> None:
    with pytest.raises(ValueError, match="phase"):
        q1.attention_flops(16, 16, "training")


def test_plots_are_written(tmp_path) -> None:
    from grader.judging.images import problem_with_png

    q1.plot_prefill_ai(tmp_path / "p.png")
    q1.plot_decode_ai(tmp_path / "d.png")
    assert problem_with_png(tmp_path / "p.png") == ""
    assert problem_with_png(tmp_path / "d.png") == ""


def test_handout_states_every_answer_table_key() -> None:
    # The handout's table of answer_table keys: rows "| `key` | value | unit |".
    handout = (SOLUTION.parent / "assignment" / "README.md").read_text()
    part1 = handout[: handout.index("## Part 2")]
    stated = set(re.findall(r"^\| `([a-z_]+)` \| .+ \| .+ \|$", part1, flags=re.M))
    assert stated == set(q1.answer_table())


def test_blank_skeleton_script_names_each_todo_instead_of_a_traceback(tmp_path) -> None:
    import subprocess
    import sys

    from tests.conftest import ASSIGNMENT

    proc = subprocess.run(
        [sys.executable, str(ASSIGNMENT / "question1.py"), "--out-dir", str(tmp_path / "plots")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "answer_table is not implemented yet" in proc.stdout
    assert "plot_prefill_ai is not implemented yet" in proc.stdout
    assert "plot_decode_ai is not implemented yet" in proc.stdout


def test_reference_script_writes_the_table_and_both_plots(tmp_path) -> None:
    assert q1.main(["--out-dir", str(tmp_path)]) == 0
    assert (tmp_path / "prefill_ai.png").is_file() and (tmp_path / "decode_ai.png").is_file()
