"""The synthetic export regraded once per test worker, shared by the batch and report tests
(both modules are in the xdist group "batch", so one worker builds it once)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from grader.ta.regrade import batch
from tests.ta.regrade.export_factory import Entry, build_export, plan_export


@dataclass
class Regraded:
    entries: list[Entry]
    export: Path
    out: Path
    summary: batch.BatchSummary


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def regraded(tmp_path_factory: pytest.TempPathFactory) -> Regraded:
    """The synthetic 20-submission export regraded once (Part 1 only, 2 at a time). Its
    hang waits rather than spins: the batch pays the same timeout and no CPU for it (the
    batch timeout tests below hang on the CPU)."""
    entries = plan_export(seed=0, hang="hang:sleep")
    export = build_export(tmp_path_factory.mktemp("export"), entries)
    out = tmp_path_factory.mktemp("regrade")
    started = time.monotonic()
    summary = batch.main(
        export_dir=export, out_dir=out, jobs=2, parts=["part1"], timeout_s=120, progress=False
    )
    elapsed = time.monotonic() - started
    print(f"\nbatch of {len(entries)}: {elapsed:.1f} s, {60 * len(entries) / elapsed:.1f}/min")
    return Regraded(entries, export, out, summary)
