"""Correct labs written as students write them, that check 4.8 must not fail: each times
the runs the handout asks for (warm-ups untimed, the median of the timed runs over L),
reaching the generations another way than the reference does.

A lab that times one mode through the module's generate function and the other through
``generate_with_cache_from`` (what ``generate_with_cache`` calls) is such a lab: the
worker records the cached runs by their model calls, outside any generate call, and the
grader reads both sources together (``latency_clock.generations_of``).
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType

import numpy as np

from grader.core.points import POINTS
from grader.parts.part4.latency_clock import CLOCKED_CASES, generations_of
from tests.conftest import ROOT, grade_checks, patched_solution

#: measure_latency's cached mode timed through generate_with_cache_from with an empty
#: cache, the cache-free one through generate_no_cache (solution/kv_lab.py, edited).
CACHE_FROM = [
    (
        '        ("cache_ms_per_token", generate_with_cache),\n    )',
        '        ("cache_ms_per_token", lambda m, ids, L: '
        "generate_with_cache_from(m, ids, None, L)),\n    )",
    )
]


class Model:
    """A stand-in model: every call returns its input (the record needs only the calls)."""

    def forward(self, input_ids, **_):
        return input_ids

    def __call__(self, input_ids, **kwargs):
        return self.forward(input_ids, **kwargs)


def mixed_lab() -> ModuleType:
    """A lab of the handout's shape whose cache-free runs go through the module's
    ``generate_no_cache`` and whose cached runs through a helper of another name, each
    run the prompt and then one token per call (the handout's calls)."""
    lab = ModuleType("mixed_lab")

    def generate_no_cache(model, ids, L):
        for step in range(L):
            model(np.zeros((1, ids.shape[1] + step)))
        return ids

    def generate_with_cache_from(model, ids, past, L):
        for step in range(L):
            model(ids if step == 0 else np.zeros((1, 1)))
        return ids

    def generate_with_cache(model, ids, L):
        return generate_with_cache_from(model, ids, None, L)

    def measure_latency(model, L_values, prompt_len=8, warmup=1, repeats=3, device="cpu"):
        ids, result = np.zeros((1, prompt_len)), {"L": list(L_values)}
        modes = (
            ("no_cache_ms_per_token", lambda L: lab.generate_no_cache(model, ids, L)),
            ("cache_ms_per_token", lambda L: generate_with_cache_from(model, ids, None, L)),
        )
        for key, run in modes:
            result[key] = [1.0 for _ in L_values]  # the figures do not matter here
            for L in L_values:
                for _ in range(warmup + repeats):
                    run(L)
        return result

    lab.generate_no_cache, lab.generate_with_cache = generate_no_cache, generate_with_cache
    lab.generate_with_cache_from, lab.measure_latency = generate_with_cache_from, measure_latency
    return lab


def test_the_record_holds_every_run_of_a_lab_reaching_one_mode_by_another_name(monkeypatch):
    """Every run of both modes is in the grader's reading of the worker's record: the
    cached ones are runs of model calls made outside any generate call."""
    from grader.parts.part4 import adapter_latency

    monkeypatch.syspath_prepend(str(ROOT / "grader" / "worker"))  # values.py, as in the worker
    case = CLOCKED_CASES[0]  # every argument passed, warm-ups included
    settings = case.settings
    out = adapter_latency.run_latency_timed(mixed_lab(), Model(), case.request())
    gens, unread = generations_of(out, settings["prompt_len"])
    assert not unread
    runs = settings["warmup"] + settings["repeats"]
    counts = Counter((g.mode, g.L) for g in gens)
    want = {(mode, L): runs for mode in ("no_cache", "cache") for L in case.L_values}
    assert dict(counts) == want


def test_a_lab_timing_its_cached_runs_through_generate_with_cache_from_keeps_4_8(tmp_path):
    submission = patched_solution(tmp_path / "submission", "kv_lab.py", CACHE_FROM)
    result = grade_checks(submission, tmp_path / "out", "part4", {"4.8"})
    assert result.score("4.8") == POINTS["part4"]["4.8"], result.output("4.8")
