"""The Part 4 adapter (grader/parts/part4/adapter.py) runs on the grading device: the
worker's environment names it (KVGRADER_DEVICE), and models and inputs go there, so
the cuda profile's benchmark measures the GPU. No GPU here: the meta device stands in.
measure_latency timed by the grader and the float16 int8 round trip run the reference
(and slips of it) in-process, as the worker would; no wall-clock limit is asserted."""

from __future__ import annotations

import time
from types import ModuleType

import numpy as np
import pytest

from grader.core.arrays import decode_array
from grader.parts.part4 import adapter as adapter_part4
from grader.parts.part4.build import LAB_MODEL, int8_cache_case
from grader.parts.part4.int8 import int8_reply, judge_int8_cache, restored_dtypes
from grader.parts.part4.latency import latency_figures
from grader.parts.part4.latency_clock import CLOCKED_CASES, generations_of, timed_problem
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


def timed(lab: ModuleType, model, case) -> tuple[str, str | None]:
    """``case`` run in-process as the worker runs it, and judged as the parent judges it."""
    out = adapter_part4.run_latency_timed(lab, model, case.request())
    figures, problem = latency_figures(plain_value(out["result"]), list(case.L_values))
    assert not problem, problem
    gens, unread = generations_of(out, case.settings["prompt_len"])
    assert not unread and gens
    return timed_problem(case, figures, gens)


def test_the_reference_passes_and_is_left_as_it_was(monkeypatch, lab_model):
    lab = reference_lab(monkeypatch)
    functions = (lab.generate_no_cache, lab.generate_with_cache)
    for case in CLOCKED_CASES:
        assert timed(lab, lab_model, case) == ("", None)
    assert (lab.generate_no_cache, lab.generate_with_cache) == functions
    assert "forward" not in vars(lab_model)
    assert lab.time.perf_counter is time.perf_counter  # no clock was ever replaced


TIMED = "start = time.perf_counter()\n                generate(model, prompt, L)"
STOPPED = "times.append(time.perf_counter() - start)"
# Wall clocks reached the ways students reach them, each taken before the grader runs:
# as a default argument, at import under another name, a module alias, in nanoseconds,
# datetime (read in C), timeit's timer, time.monotonic and time.time.
CLOCKS = {
    "default argument": [
        ('    device: str = "cpu",\n) -> dict[str, list]:\n    """Milliseconds',
         '    device: str = "cpu",\n    clock=time.perf_counter,\n) -> dict[str, list]:\n'
         '    """Milliseconds'),
        ("start = time.perf_counter()", "start = clock()"),
        (STOPPED, "times.append(clock() - start)")],
    "imported by name": [("import time\n", "import time\nfrom time import perf_counter as pc\n"),
                         ("time.perf_counter()", "pc()")],
    "module alias": [("import time\n", "import time\nimport time as t\n"),
                     ("time.perf_counter()", "t.perf_counter()")],
    "perf_counter_ns": [("time.perf_counter()", "time.perf_counter_ns() / 1e9")],
    "datetime": [("import time\n", "import time\nfrom datetime import datetime\n"),
                 ("start = time.perf_counter()", "start = datetime.now()"),
                 (STOPPED, "times.append((datetime.now() - start).total_seconds())")],
    "timeit": [("import time\n", "import time\nimport timeit\n"),
               ("time.perf_counter()", "timeit.default_timer()")],
    "monotonic": [("time.perf_counter()", "time.monotonic()")],
    "time.time": [("time.perf_counter()", "time.time()")],
}  # fmt: skip


@pytest.mark.parametrize("clock", CLOCKS)
def test_any_wall_clock_however_reached_passes(monkeypatch, lab_model, clock):
    lab = reference_lab(monkeypatch, *CLOCKS[clock])
    assert timed(lab, lab_model, CLOCKED_CASES[0]) == ("", None)


WARM_UPS = {
    "three of its own before the loop": (
        '    for L in L_values:\n        result["L"].append(int(L))\n',
        "    for _ in range(3):\n        generate_no_cache(model, prompt, 4)\n"
        "        generate_with_cache(model, prompt, 4)\n"
        '    for L in L_values:\n        result["L"].append(int(L))\n'),
    "one more at every L": ("            times = []\n",
                            "            generate(model, prompt, L)\n            times = []\n"),
    "functions taken at import": (
        '    modes = (\n        ("no_cache_ms_per_token", generate_no_cache),\n'
        '        ("cache_ms_per_token", generate_with_cache),\n    )\n',
        "    modes = MODES_AT_IMPORT\n"),
}  # fmt: skip


@pytest.mark.parametrize("how", WARM_UPS)
def test_warm_ups_of_its_own_and_functions_taken_early_pass(monkeypatch, lab_model, how):
    lab = reference_lab(monkeypatch, WARM_UPS[how])
    if how == "functions taken at import":  # never looked up by name: found by their calls
        lab.MODES_AT_IMPORT = (("no_cache_ms_per_token", lab.generate_no_cache),
                               ("cache_ms_per_token", lab.generate_with_cache))  # fmt: skip
    for case in CLOCKED_CASES:
        assert timed(lab, lab_model, case) == ("", None)


@pytest.mark.parametrize(
    "edit",
    [
        ("prompt_len: int = 8,", "prompt_len: int = 7,"),
        ("repeats: int = 3,", "repeats: int = 2,"),
        ("(1, prompt_len), generator=gen)", "(2, prompt_len), generator=gen)"),
        ("* 1000 / L)", "* 1000 / (L + 1))"),
        ("* 1000 / L)", "* 1000)"),
        ("* 1000 / L)", "* 2000 / L)"),
        ("time.perf_counter()", "time.process_time()"),
        ("time.perf_counter()", "time.thread_time()"),
    ],
    ids=lambda e: e[1],
)
def test_a_changed_measure_latency_fails(monkeypatch, lab_model, edit):
    lab = reference_lab(monkeypatch, edit)
    problems = [timed(lab, lab_model, c)[0] for c in CLOCKED_CASES]
    assert any(problems)
    if "process_time" in edit[1]:
        assert all("time.process_time" in p for p in problems), problems


def test_the_harness_calls_the_generation_as_a_script_would(monkeypatch, lab_model):
    """No context of the grader's around the student's generation: grad mode is what
    Python starts with, and a lab that leaves out torch.no_grad() is seen doing so."""
    import torch

    seen: list[bool] = []
    lab = reference_lab(monkeypatch)
    plain = reference_lab(
        monkeypatch, ("@torch.no_grad()\ndef generate_with_cache_from(",
                      "def generate_with_cache_from("),
        ("@torch.no_grad()\ndef generate_with_cache(", "def generate_with_cache("),
        ("    past_len = 0 if past_key_values is None",
         "    seen.append(torch.is_grad_enabled())\n    past_len = 0 if past_key_values is None"),
    )  # fmt: skip
    plain.seen = seen
    ids = np.arange(1, 7, dtype=np.int64)[None, :]
    assert adapter_part4.run_generate(lab, lab_model, ids, 3, True)["grad_recorded"] is False
    out = adapter_part4.run_generate(plain, lab_model, ids, 3, True)
    assert out["grad_recorded"] is True and seen == [True]
    again = adapter_part4.run_generate(lab, lab_model, ids, 3, True)
    np.testing.assert_array_equal(out["tokens"], again["tokens"])
    assert torch.is_grad_enabled()


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
