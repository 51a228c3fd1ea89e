"""grader/parts/part3/adapter.py (and adapter_load.py) on the course's own Llama code: built
without ``Llama.build``, with ``ModelArgs`` fields of its own and ``.cuda()`` in its constructor."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from grader.core.paths import TEST_CASES
from grader.parts.part3 import adapter, adapter_load
from grader.parts.part3.build import import_llama
from tests.conftest import ROOT

COURSE = ROOT / "tests" / "submissions" / "course_part3"
CKPT = TEST_CASES / "public" / "part3" / "tiny_llama"


@pytest.fixture
def notes() -> Iterator[dict]:
    """The worker's notes, emptied before and after each test."""
    saved = dict(adapter_load.NOTES)
    adapter_load.NOTES.clear()
    adapter_load.NOTES["cuda_calls"] = 0
    yield adapter_load.NOTES
    adapter_load.NOTES.clear()
    adapter_load.NOTES.update(saved)


@pytest.fixture
def cuda_redirected(monkeypatch: pytest.MonkeyPatch, notes: dict) -> dict:
    """``.cuda()`` sent to the grading device, as the worker does without a GPU (undone after)."""
    monkeypatch.setattr(torch.Tensor, "cuda", torch.Tensor.cuda)
    monkeypatch.setattr(nn.Module, "cuda", nn.Module.cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    adapter.redirect_cuda()
    return notes


def settings(kv_caching: bool) -> dict:
    return {
        "ckpt_dir": str(CKPT),
        "tokenizer_path": str(CKPT / "tokenizer.model"),
        "max_seq_len": 64,
        "max_batch_size": 2,
        "kv_caching": kv_caching,
        "device": "cpu",
    }


def test_cuda_calls_land_on_the_grading_device_and_are_counted(cuda_redirected: dict) -> None:
    assert torch.zeros(3).cuda().device.type == "cpu"
    assert next(nn.Linear(2, 2).cuda().parameters()).device.type == "cpu"
    assert cuda_redirected["cuda_calls"] == 2


def test_model_args_takes_only_the_fields_the_class_has(notes: dict) -> None:
    @dataclass
    class ModelArgs:
        dim: int = 8
        kv_caching: bool = True

    module = type("model", (), {"ModelArgs": ModelArgs})
    args = adapter_load.model_args(
        module, {"dim": 16, "use_scaled_rope": True, "kv_caching": False}
    )
    assert (args.dim, args.kv_caching) == (16, False)
    assert notes["dropped_fields"] == ["use_scaled_rope"]


def test_the_model_class_may_be_called_transformer() -> None:
    class Transformer(nn.Module):
        pass

    module = type("model", (), {"Transformer": Transformer, "Llama": object})
    assert adapter_load.model_class(module) is Transformer
    with pytest.raises(adapter_load.LoadError, match="define Llama \\(or Transformer\\)"):
        adapter_load.model_class(type("model", (), {}))


def test_strict_load_names_both_sides_and_lora() -> None:
    class LoRA(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base, self.lora_a = nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False)

    model = nn.Module()
    model.wq = LoRA()
    with pytest.raises(adapter_load.LoadError) as caught:
        adapter_load.strict_load(model, {"wq.weight": torch.zeros(2, 2)})
    message = str(caught.value)
    assert "lacks: wq.base.weight, wq.lora_a.weight" in message
    assert "your model lacks: wq.weight" in message
    assert "LoRA layers are switched on" in message


@pytest.mark.parametrize("kv_caching", [True, False])
def test_the_course_code_builds_the_course_way(cuda_redirected: dict, kv_caching: bool) -> None:
    pkg = import_llama(COURSE)
    model, tokenizer = adapter_load.build_from_checkpoint(pkg, settings(kv_caching))
    notes = adapter_load.build_notes(model)
    assert notes["built_by"] == "constructor" and notes["switch"] is False
    assert notes["dropped_fields"] == ["use_scaled_rope"]
    assert notes["cuda_calls"] == (4 if kv_caching else 0)  # cache_k, cache_v per layer
    run = {"max_gen_len": 4, "temperature": 0.0, "top_p": 0.9, "seed": 0}
    out = adapter.run_generate(model, tokenizer, ["Hello"], {**run, "kv_caching": kv_caching})
    assert out["first_ids"] == [tokenizer.bos_id]
    prompt = tokenizer.encode("Hello", bos=True, eos=False)
    assert out["calls"][0] == [0, len(prompt)]  # the whole prompt, from position 0


def test_the_kit_layout_still_builds_with_llama_build(notes: dict) -> None:
    pkg = import_llama(ROOT / "solution")
    model, _ = adapter_load.build_from_checkpoint(pkg, settings(True))
    assert adapter_load.build_notes(model)["built_by"] == "build"
    assert adapter_load.build_notes(model)["switch"] is True
