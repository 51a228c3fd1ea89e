"""benchmarks/gpu_parts.sh and its plan (benchmarks/gpu_plan.py), the script a lent GPU
runs: every documented name resolves to a submission and its checks, and the script's
rounds grade every name with ``--device cuda`` and pack each result, checked here with
a stand-in for ``timeout`` that records the grader's command instead of running it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from grader.ta.calibrate import BENCHMARK_PARTS, EXTRA_BASELINES
from grader.ta.regen import import_path
from tests.conftest import ROOT

plan = import_path(ROOT / "benchmarks" / "gpu_plan.py", "gpu_plan_under_test")


def test_every_who_and_what_resolves() -> None:
    assert plan.parse("reference_all") == ("reference", list(BENCHMARK_PARTS))
    assert plan.parse("cache_free_part4") == ("cache_free", ["part4"])
    assert plan.designs("cache_free", ["part3"]) is None  # the part's main baseline
    # closer_all: the closer design where a part has one, its main baseline elsewhere
    assert plan.designs("closer", list(BENCHMARK_PARTS)) == {
        p: names[0] for p, names in EXTRA_BASELINES.items()
    }
    assert "part2" not in EXTRA_BASELINES


@pytest.mark.parametrize(
    ("name", "why"),
    [("closer_part2", "no closer design"), ("fast_part2", "WHO must"), ("reference_part9", "WHAT")],
)
def test_a_name_that_is_no_plans_is_refused_before_any_copy(name: str, why: str, capsys) -> None:
    assert plan.main(["reference_part2", name]) == 2
    captured = capsys.readouterr()
    assert why in captured.err and captured.out == ""


STAND_IN = """#!/bin/sh
# timeout -s ABRT SECS python3 -m grader grade SUB ...: record it, write a results file.
shift 3
echo "$*" >> "$CALLS"
while [ $# -gt 0 ]; do
    if [ "$1" = --results ]; then echo '{"tests": []}' > "$2"; fi
    shift
done
"""


def test_rounds_grade_every_name_on_cuda_and_pack_every_result(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "timeout").write_text(STAND_IN)
    (bin_dir / "timeout").chmod(0o755)
    python = bin_dir / "python3"  # the plan runs on the kit's interpreter
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
        "FIRST": "reference_part2 cache_free_part4", "AFTER": "reference_all", "ROUNDS": "2",
        "OUT": str(tmp_path / "out"), "BUDGET": "120", "WHEELS": str(tmp_path / "none"),
    }  # fmt: skip
    done = subprocess.run(["sh", "benchmarks/gpu_parts.sh"], cwd=ROOT, env=env, timeout=120,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 5 and all("-m grader grade" in c and "--device cuda" in c for c in calls)
    assert sum("--parts part2 --tags benchmark" in c for c in calls) == 2
    assert sum("--parts part4 --tags benchmark" in c for c in calls) == 2
    whole = [c for c in calls if "--parts" not in c]
    assert len(whole) == 1 and whole[0].split()[4] == "solution" and "--tags" not in whole[0]
    with tarfile.open(tmp_path / "out" / "gpu_parts.tgz") as packed:
        names = {Path(n).name for n in packed.getnames()}
        planned = packed.extractfile("./plan.txt").read().decode().splitlines()  # type: ignore[union-attr]
    for copy in {line.split()[1] for line in planned} - {"solution"}:
        shutil.rmtree(copy)  # the cache-free copies the plan made
    results = {"reference_part2_r1", "reference_part2_r2", "cache_free_part4_r1",
               "cache_free_part4_r2", "reference_all"}  # fmt: skip
    assert {f"{r}.json" for r in results} <= names and {"plan.txt", "steps.txt"} <= names
