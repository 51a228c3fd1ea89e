"""The Part 4 adapter (grader/parts/part4/adapter.py) runs on the grading device: the
worker's environment names it (KVGRADER_DEVICE), and models and inputs go there, so
the cuda profile's benchmark measures the GPU. No GPU here: the meta device stands in."""

from __future__ import annotations

import numpy as np
import pytest

from grader.parts.part4 import adapter as adapter_part4
from grader.parts.part4.build import LAB_MODEL
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
