"""A cache-free submission that makes its own timing noisy on purpose gains nothing: its
worker burns a random amount of CPU at random moments (a thread that spins for 0-80 ms,
then sleeps for 0-40 ms), so that every timed run costs its work plus a random share of
noise and no bound on its ratios can settle. Every timed check it meets scores 0: the
noise only ever adds time, the yardstick's median stays far from its limit, and where a
criterion stays undecided its runs are far noisier than the reference's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grader.ta.calibrate import cache_free_submission
from tests.conftest import ATTACK, PART2_LIMITS, grade_checks

#: Appended to each part's file: noise of its own in every request of its worker.
NOISE = """

import random as _random
import threading as _threading
import time as _time


def _make_noise():
    while True:
        end = _time.process_time() + _random.uniform(0.0, 0.08)
        while _time.process_time() < end:
            pass
        _time.sleep(_random.uniform(0.0, 0.04))


_threading.Thread(target=_make_noise, daemon=True).start()
"""

FILES = {
    "part2": ("transformer_skeleton.py", "2.11"),
    "part3": ("llama/generation.py", "3.11"),
    "part4": ("kv_lab.py", "4.6"),
}


@ATTACK
@pytest.mark.parametrize("part", sorted(FILES))
def test_a_noisy_cache_free_submission_scores_0_on_every_timed_check(
    tmp_path: Path, part: str
) -> None:
    file, check = FILES[part]
    submission = cache_free_submission([part])
    try:
        path = submission / file
        path.write_text(path.read_text() + NOISE)
        graded = grade_checks(submission, tmp_path / "out", part, {check}, PART2_LIMITS)
    finally:
        shutil.rmtree(submission, ignore_errors=True)
    assert graded.score(check) == 0, graded.output(check)
    record = graded.results.extra_data["benchmarks"][check]
    assert not record["passed"]
    assert not any(c["passed"] for c in record["criteria"] if "reference" in c["label"])
