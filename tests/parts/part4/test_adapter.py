"""The Part 4 adapter (grader/parts/part4/adapter.py) runs on the grading device: the
worker's environment names it (KVGRADER_DEVICE), and models and inputs go there, so
the cuda profile's benchmark measures the GPU. No GPU here: the meta device stands in.
The driven clock of measure_latency and the float16 int8 round trip run the reference
(and slips of it) in-process, as the worker would."""

from __future__ import annotations

import time
import timeit
from types import ModuleType

import numpy as np
import pytest

from grader.core.arrays import decode_array
from grader.parts.part4 import adapter as adapter_part4
from grader.parts.part4.build import LAB_MODEL, int8_cache_case
from grader.parts.part4.int8 import int8_reply, judge_int8_cache, restored_dtypes
from grader.parts.part4.latency import latency_figures
from grader.parts.part4.latency_clock import CLOCKED_CASES, clocked_problem
from grader.parts.part4.support import plain_value
from tests.conftest import ROOT


@pytest.mark.parametrize(("env", "want"), [(None, "cpu"), ("meta", "meta")])
def test_models_and_inputs_go_to_the_grading_device(monkeypatch, env, want) -> None:
    if env is None:
        monkeypatch.delenv("KVGRADER_DEVICE", raising=False)
    else:
        monkeypatch.setenv("KVGRADER_DEVICE", env)
    model = adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"])
    assert {p.device.type for p in model.parameters()} == {want}
    assert adapter_part4.as_ids(model, np.zeros((1, 3), dtype=np.int64)).device.type == want


def test_weights_do_not_depend_on_the_device(monkeypatch) -> None:
    monkeypatch.setenv("KVGRADER_DEVICE", "meta")
    on_cpu = adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu")
    again = adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu")
    for a, b in zip(on_cpu.parameters(), again.parameters(), strict=True):
        assert (a == b).all()


def test_a_workload_model_is_drawn_where_it_runs(monkeypatch) -> None:
    """A GPU workload's GPT-2 (``on_device``) is made on the grading device, never drawn
    on a core first (7-10 s for its 0.3 billion weights on the H200's host); on one
    device the draw is the same in every process."""
    import torch

    made: list[str] = []
    real = torch.Tensor.normal_

    def watched(self, *args, **kwargs):
        made.append(self.device.type)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "normal_", watched)
    monkeypatch.setenv("KVGRADER_DEVICE", "meta")
    model = adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"], on_device=True)
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    assert made and set(made) == {"meta"}
    a, b = (
        adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu", on_device=True)
        for _ in range(2)
    )
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert (x == y).all()


def test_the_first_model_call_of_measure_latency_is_delayed_once(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "grader" / "worker"))  # values.py, as in the worker

    class Lab:
        @staticmethod
        def measure_latency(model, L_values, prompt_len, warmup, repeats, device):
            for _ in range(3):
                model(None)
            return {"L": list(L_values)}

    class Model:
        def forward(self, x):
            return x

        def __call__(self, x):
            return self.forward(x)

    request = {"first_call_delay_s": 0.0, "L_values": [8], "prompt_len": 8}
    out = adapter_part4.run_latency(Lab, Model(), {**request, "warmup": 1, "repeats": 1})
    assert out["forward_calls"] == 3
    assert out["result"]["value"]["L"]["value"] == [{"kind": "int", "value": 8}]


def reference_lab(monkeypatch, *edits: tuple[str, str]) -> ModuleType:
    """solution/kv_lab.py as a module, with edits of its source (each old text replaced
    wherever it occurs)."""
    monkeypatch.syspath_prepend(str(ROOT / "grader" / "worker"))  # values.py, as in the worker
    source = (ROOT / "solution" / "kv_lab.py").read_text()
    for old, new in edits:
        assert old in source
        source = source.replace(old, new)
    lab = ModuleType("kv_lab_under_test")
    exec(compile(source, "kv_lab.py", "exec"), lab.__dict__)
    return lab


@pytest.fixture(scope="module")
def lab_model():
    return adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"], on="cpu")


def clocked(lab: ModuleType, model, case) -> dict[str, list[float]]:
    out = adapter_part4.run_latency_clock(lab, model, case.request())
    figures, problem = latency_figures(plain_value(out["result"]), list(case.L_values))
    assert not problem, problem
    return figures


def test_the_driven_clock_gives_the_reference_the_figures_foretold(monkeypatch, lab_model):
    lab = reference_lab(monkeypatch)
    real = time.perf_counter
    for case in CLOCKED_CASES:
        assert clocked_problem(case, clocked(lab, lab_model, case)) == ("", None)
    assert time.perf_counter is real and timeit.default_timer is real
    assert lab.time.perf_counter is real


@pytest.mark.parametrize(
    "edit",
    [
        ("prompt_len: int = 8,", "prompt_len: int = 7,"),
        ("warmup: int = 1,", "warmup: int = 2,"),
        ("repeats: int = 3,", "repeats: int = 2,"),
        ("(1, prompt_len), generator=gen)", "(2, prompt_len), generator=gen)"),
        ("if i >= warmup:", "if i == warmup:"),
        ("* 1000 / L)", "* 1000 // L)"),
        ("* 1000 / L)", "* 1001 / L)"),
    ],
    ids=lambda e: e[1],
)
def test_the_driven_clock_tells_a_changed_measure_latency(monkeypatch, lab_model, edit):
    lab = reference_lab(monkeypatch, edit)
    problems = [clocked_problem(c, clocked(lab, lab_model, c))[0] for c in CLOCKED_CASES]
    assert any(problems)


@pytest.mark.parametrize(
    "clock",
    ["time.monotonic()", "time.time()", "time.monotonic_ns() / 1e9", "timeit.default_timer()"],
)  # fmt: skip
def test_every_standard_clock_is_driven(monkeypatch, lab_model, clock):
    """The lab leaves the clock open: a measure_latency timed with any standard clock gets
    the figures the driven clock foretells, and every real clock is back afterwards."""
    import time as time_module

    clocks = adapter_part4.DRIVEN_CLOCKS + adapter_part4.CPU_CLOCKS
    reals = {name: getattr(time_module, name) for name in clocks}
    lab = reference_lab(
        monkeypatch,
        ("import time\n", "import time\nimport timeit\n"),
        ("time.perf_counter()", clock),
    )
    case = CLOCKED_CASES[0]  # every argument passed: the other case differs only in defaults
    assert clocked_problem(case, clocked(lab, lab_model, case)) == ("", None)
    assert {name: getattr(time_module, name) for name in reals} == reals
    assert timeit.default_timer is time.perf_counter


@pytest.mark.parametrize(
    "clock", ["time.process_time()", "time.process_time_ns() / 1e9", "time.thread_time()"]
)
def test_latency_timed_in_cpu_time_is_not_latency(monkeypatch, lab_model, clock):
    """The lab asks for latency: a measure_latency timed with the process's (or the
    thread's) CPU time gets figures of its own, and process_time's are named."""
    import time as time_module

    real = time_module.process_time
    lab = reference_lab(monkeypatch, ("time.perf_counter()", clock))
    for case in CLOCKED_CASES:
        problem, name = clocked_problem(case, clocked(lab, lab_model, case))
        assert problem and name is None
        assert ("time.process_time" in problem) is ("process_time" in clock), problem
    assert time_module.process_time is real


def test_a_clock_alias_taken_at_import_is_driven_too(monkeypatch, lab_model):
    lab = reference_lab(
        monkeypatch,
        ("import time\n", "import time\nfrom time import perf_counter\n"),
        ("time.perf_counter()", "perf_counter()"),
    )
    case = CLOCKED_CASES[0]
    assert clocked_problem(case, clocked(lab, lab_model, case)) == ("", None)
    assert lab.perf_counter is time.perf_counter


@pytest.mark.parametrize(
    "edit",
    [
        ("", ""),
        ("scale == 0, torch.ones_like", "scale == -1, torch.ones_like"),
        ("dtype = pairs[0][0].dtype if pairs else", "dtype = pairs[0][0].dtype if not pairs else"),
        (".clamp(-127, 127).to(torch.int8)", ".clamp(-126, 127).to(torch.int8)"),
    ],
    ids=lambda e: e[1] or "reference",
)
def test_the_float16_round_trip_of_the_reference_passes_and_of_a_slip_fails(monkeypatch, edit):
    lab = reference_lab(monkeypatch, edit) if edit[0] else reference_lab(monkeypatch)
    cache = [decode_array(t).astype(np.float16) for t in int8_cache_case()["cache"]]
    arrays = {f"{'kv'[i % 2]}{i // 2}": x for i, x in enumerate(cache)}
    header, out = adapter_part4.run_int8_cache(lab, arrays, len(cache) // 2)
    q_arrays, q_dtypes, reported, restored, _ = int8_reply(header, out, cache)
    v = judge_int8_cache(cache, q_arrays, q_dtypes, reported, restored, restored_dtypes(header))
    assert v.passed is (edit[1] == ""), v.failures(0)
    assert header["deq_dtypes"] == ["float32" if "not pairs" in edit[1] else "float16"] * 4


def test_a_pool_request_gets_each_steps_gap_instead_of_the_logits(monkeypatch) -> None:
    """A GPU workload's pool asks for 512 steps over GPT-2's 50257 logits (100 MB, past
    the reply limit): the worker sends each step's best-minus-runner-up gap instead."""
    from grader.parts.part4.pools import min_gap
    from grader.ta.regen import import_path

    monkeypatch.delenv("KVGRADER_DEVICE", raising=False)
    reference = import_path(ROOT / "solution" / "kv_lab.py", "kv_lab_for_gaps")
    monkeypatch.setattr(adapter_part4, "module", reference, raising=False)
    model = adapter_part4.build(LAB_MODEL["config"], LAB_MODEL["seed"])
    monkeypatch.setitem(adapter_part4.MODELS, "lab", model)
    ids = np.array([[5, 6, 7, 8], [9, 3, 2, 1]], dtype=np.int64)  # a batch of candidates
    request = {"op": "generate", "model": "lab", "n": 6, "cached": True}
    _, full = adapter_part4.handle(request, {"ids": ids})
    _, gaps = adapter_part4.handle({**request, "gaps_only": True}, {"ids": ids})
    assert "step_logits" not in gaps and gaps["step_gaps"].shape == (6, 2)  # (steps, B)
    np.testing.assert_array_equal(gaps["tokens"], full["tokens"])
    for row in range(2):
        expected = min_gap(full["step_logits"][:, row])
        assert float(gaps["step_gaps"][:, row].min()) == pytest.approx(expected, abs=1e-6)
