"""Work a submission hides from the CPU clock by handing it to another process.

A cache-free generation whose steps run in a helper's child, reaped by the helper
(alive when the grader reads the clock), or in a helper made with
``clone(CLONE_PARENT)``, which the worker's parent (the fork server) reaps: the cached
path looks free. Each is written for Part 2's ``generate``, Part 3's ``generate``
(llama/generation.py) and Part 4's ``generate_with_cache`` (kv_lab.py), with the
worker's call records forged to a cache's, and graded with the worker's cgroup where
the machine offers one and with the process-tree fallback (``KVGRADER_CGROUPS=0``);
both count the helper's work, so the cache-free design loses the timed checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.sandbox import cgroups
from grader.sandbox.sandbox import Limits
from tests.conftest import FAST_LIMITS, PART2_LIMITS, Graded, grade_checks, patched_solution
from tests.grading.test_hostile_measures import FORGE_PART2_LENGTHS

PART3_LIMITS = Limits(request_timeout_s=30.0, startup_timeout_s=30.0)

# How the helper is made, and how the work reaches it: the helper forks the worker's
# child, waits for it (so its time sits in the helper's reaped-children figure) and stays
# alive past the grader's reading of the clock; or the helper is the worker's sibling
# (clone(CLONE_PARENT | SIGCHLD) gives it to the worker's parent, which reaps it as soon
# as it exits). ``{work}`` is the cache-free call whose result goes back through a pipe.
# Each answers only once the process that did the work has been reaped, so no reading
# of the clock can still find it among the worker's descendants.
REAPED_BY_A_LIVE_HELPER = (
    "    reaped_r, reaped_w = os.pipe()\n"
    "    if os.fork() == 0:\n"
    "        if os.fork() == 0:\n"
    "{work}"
    "        os.close(w)\n"
    "        os.wait()\n"
    "        os.write(reaped_w, b'x')\n"
    "        import time\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "    os.close(reaped_w)\n",
    "    os.read(reaped_r, 1)\n    os.close(reaped_r)\n",
)
CLONED_AS_A_SIBLING = (
    "    import ctypes\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    libc.syscall.restype = ctypes.c_long\n"
    "    if True:\n"
    "        pid = libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0)\n"
    "        if pid == 0:\n"
    "{work}",
    "    import time\n"
    "    while True:  # until the fork server has reaped it\n"
    "        try:\n"
    "            os.kill(pid, 0)\n"
    "        except ProcessLookupError:\n"
    "            break\n"
    "        time.sleep(0.001)\n",
)
OFFLOADS = {"live-helper": REAPED_BY_A_LIVE_HELPER, "clone-parent": CLONED_AS_A_SIBLING}


def offloaded(spawn: tuple[str, str], cache_free: str, indent: str) -> str:
    """The body of a cached generation that runs ``cache_free`` (an expression) in a helper
    made by ``spawn`` (the code that makes it, and the code that waits until it has been
    reaped) and returns its result, indented by ``indent``."""
    make, wait = spawn
    work = (
        "            os.close(r)\n"
        f"            out = {cache_free}\n"
        "            with os.fdopen(w, 'wb') as f:\n"
        "                f.write(pickle.dumps(out))\n"
        "            os._exit(0)\n"
    )
    body = (
        "    import os, pickle\n"
        "    r, w = os.pipe()\n" + make.replace("{work}", work) + "    os.close(w)\n"
        "    with os.fdopen(r, 'rb') as f:\n"
        "        out = pickle.loads(f.read())\n" + wait + "    return out\n"
    )
    return "".join(indent + line + "\n" for line in body.splitlines())


def part2_edits(spawn: tuple[str, str]) -> list[tuple[str, str]]:
    """Part 2: generate(use_cache=True) runs the cache-free path in the helper."""
    wrapper = (
        "    def generate(self, input_ids, max_new_tokens, temperature=1.0, use_cache=True):\n"
        "        if not use_cache:\n"
        "            return self._generate(input_ids, max_new_tokens, temperature, False)\n"
        + offloaded(spawn, "self._generate(input_ids, max_new_tokens, temperature, False)", "    ")
        + "\n    def _generate(\n"
    )
    anchor = "# One layer's cache"
    return [("    def generate(\n", wrapper), (anchor, FORGE_PART2_LENGTHS + anchor)]


# Part 3: the worker's record of the model calls, rewritten to a prefill and then one token
# per step (the helper's calls are made in another process and never recorded).
FORGE_PART3_CACHED_CALLS = """import sys as _sys

_adapter = _sys.modules.get("adapter_part3")
if _adapter is not None:  # inside the grader's worker: rewrite what it records
    _real_run_generate = _adapter.run_generate

    def _forged_run_generate(model, tokenizer, prompts, settings):
        out = _real_run_generate(model, tokenizer, prompts, settings)
        if settings["kv_caching"]:
            lengths = [len(tokenizer.encode(p, bos=True, eos=False)) for p in prompts]
            first = min(lengths)
            total = min(model.params.max_seq_len, max(lengths) + settings["max_gen_len"])
            out["calls"] = [[0, first]] + [[s, 1] for s in range(first, total - 1)]
        return out

    _adapter.run_generate = _forged_run_generate


"""


def part3_edits(spawn: tuple[str, str]) -> list[tuple[str, str]]:
    """Part 3: generate(kv_caching=True) runs the cache-free path in the helper."""
    args = "tokenizer, prompts, max_gen_len, temperature, top_p, False, device"
    wrapper = (
        "    def generate(self, tokenizer, prompts, max_gen_len, temperature=0.6, top_p=0.9,\n"
        "                 kv_caching=True, device='cpu'):\n"
        f"        if not kv_caching:\n            return self._generate({args})\n"
        + offloaded(spawn, f"self._generate({args})", "    ")
        + "\n    def _generate(\n"
    )
    anchor = "def sample_top_p("
    return [("    def generate(\n", wrapper), (anchor, FORGE_PART3_CACHED_CALLS + anchor)]


# Part 4: the worker's record of a cached run's model calls, rewritten to a prefill and
# then one token per call.
FORGE_PART4_CALLS = """import sys as _sys

_adapter = _sys.modules.get("adapter_part4")
if _adapter is not None:  # inside the grader's worker: rewrite what it records
    _real_run_generate = _adapter.run_generate

    def _forged_run_generate(mod, model, ids, n, cached, cached_prefix=0, **options):
        out = _real_run_generate(mod, model, ids, n, cached, cached_prefix, **options)
        if cached and not cached_prefix:
            out["lengths"] = [ids.shape[1]] + [1] * (n - 1)
            out["use_cache"] = [True] * n
            out["past_given"] = [False] + [True] * (n - 1)
        return out

    _adapter.run_generate = _forged_run_generate


"""
PART4_SIGNATURE = (
    "def generate_with_cache(model: torch.nn.Module, input_ids: torch.Tensor, L: int) "
    "-> torch.Tensor:\n"
)


def part4_edits(spawn: tuple[str, str]) -> list[tuple[str, str]]:
    """Part 4: generate_with_cache runs generate_no_cache in the helper."""
    wrapper = (
        "def generate_with_cache(model, input_ids, L):\n"
        + offloaded(spawn, "generate_no_cache(model, input_ids, L)", "")
        + "\n\n@torch.no_grad()\ndef _generate_with_cache(model, input_ids, L):\n"
    )
    anchor = "def cuda_sync("
    return [(PART4_SIGNATURE, wrapper), (anchor, FORGE_PART4_CALLS + anchor)]


# part: (file, edits, a check its right output keeps, the timed checks it loses, limits)
PARTS = {
    "part2": ("transformer_skeleton.py", part2_edits, "2.8", ("2.9", "2.11"), PART2_LIMITS),
    "part3": ("llama/generation.py", part3_edits, "3.5", ("3.7", "3.11"), PART3_LIMITS),
    "part4": ("kv_lab.py", part4_edits, "4.2", ("4.6",), FAST_LIMITS),
}


@pytest.mark.parametrize("use_cgroups", ["1", "0"], ids=["cgroup", "process-tree"])
@pytest.mark.parametrize("offload", OFFLOADS)
# Part 2's offloads run in `make test`; Parts 3 and 4 (about 30 s a grading) in
# `make attack-tests`, which CI runs beside the mutation runs.
@pytest.mark.parametrize(
    "part", [pytest.param(p, marks=() if p == "part2" else pytest.mark.attacks) for p in PARTS]
)
def test_work_reaped_elsewhere_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: str, offload: str, use_cgroups: str
) -> None:
    monkeypatch.setenv(cgroups.CGROUPS_ENV, use_cgroups)
    file, edits, kept, lost, limits = PARTS[part]
    submission = patched_solution(tmp_path / "sub", file, edits(OFFLOADS[offload]))
    graded = grade_checks(submission, tmp_path / "out", part, {kept, *lost}, limits)
    assert graded.score(kept) == graded.test(kept)["max_score"], graded.output(kept)
    for number in lost:
        assert graded.score(number) == 0, graded.output(number)
    assert_accounting(graded, use_cgroups)


def assert_accounting(graded: Graded, use_cgroups: str) -> None:
    """The results name the accounting used: the worker's cgroup where one was asked for
    and the machine offers it, else the process tree."""
    accounting = graded.results.extra_data["cpu_accounting"]
    offered = cgroups.create("probe")
    if offered is not None:
        offered.remove()
    if use_cgroups == "1" and offered is not None:
        assert accounting == [offered.accounting]
    else:
        assert accounting == [cgroups.PROCESS_TREE]
