"""benchmarks/regrade_throughput.py on a small export: its figures come from a real batch
(the full measurement, 20 submissions of every part, is `make throughput`)."""

from __future__ import annotations

import json

import pytest

from grader.ta.regen import import_path
from tests.conftest import ROOT


def test_a_small_regrade_is_counted_and_timed(capsys: pytest.CaptureFixture) -> None:
    bench = import_path(ROOT / "benchmarks" / "regrade_throughput.py", "regrade_throughput_test")
    assert bench.main(["--submissions", "3", "--parts", "part1", "--jobs", "2"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["submissions"] == 3 and figures["statuses"].get("graded") == 3
    assert figures["parts"] == ["part1"] and figures["jobs"] == 2
    assert figures["per_minute"] > 0 and figures["wall_s"] > 0
    assert figures["cpu_s_per_submission"] > 0  # the gradings' own processes are counted
