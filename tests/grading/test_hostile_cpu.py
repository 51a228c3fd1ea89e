"""Work a submission hides from the CPU clock by handing it to another process.

A cache-free ``generate`` whose steps run in a helper's child, reaped by the helper
(alive when the grader reads the clock), or in a helper made with
``clone(CLONE_PARENT)``, which the worker's parent (the fork server) reaps: the cached
path looks free. Each is graded with the worker's cgroup where the machine offers one
and with the process-tree fallback (``KVGRADER_CGROUPS=0``); both count the helper's
work, so the cache-free design loses the benchmark checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.sandbox import cgroups
from tests.conftest import PART2_LIMITS, grade_checks, patched_solution
from tests.grading.test_hostile_measures import FORGE_PART2_LENGTHS

_WRAP_HEAD = (
    "    def generate(self, input_ids, max_new_tokens, temperature=1.0, use_cache=True):\n"
    "        if not use_cache:\n"
    "            return self._generate(input_ids, max_new_tokens, temperature, False)\n"
    "        import pickle\n"
    "        r, w = os.pipe()\n"
)
_WRAP_TAIL = (
    "        os.close(w)\n"
    "        with os.fdopen(r, 'rb') as f:\n"
    "            return pickle.loads(f.read())\n"
    "\n"
    "    def _generate(\n"
)
_WORK = (
    "                os.close(r)\n"
    "                out = self._generate(input_ids, max_new_tokens, temperature, False)\n"
    "                with os.fdopen(w, 'wb') as f:\n"
    "                    f.write(pickle.dumps(out))\n"
    "                os._exit(0)\n"
)

# The helper forks the worker's child, waits for it (so its time sits in the helper's
# reaped-children figure) and stays alive past the grader's reading of the clock.
REAPED_BY_A_LIVE_HELPER = (
    "    def generate(\n",
    _WRAP_HEAD
    + "        if os.fork() == 0:\n"
    + "            if os.fork() == 0:\n"
    + _WORK
    + "            os.close(w)\n"
    + "            os.wait()\n"
    + "            import time\n"
    + "            time.sleep(60)\n"
    + "            os._exit(0)\n"
    + _WRAP_TAIL,
)

# The helper is the worker's sibling: clone(CLONE_PARENT | SIGCHLD) gives it to the
# worker's parent, which reaps it as soon as it exits.
CLONED_AS_A_SIBLING = (
    "    def generate(\n",
    _WRAP_HEAD
    + "        import ctypes\n"
    + "        libc = ctypes.CDLL(None, use_errno=True)\n"
    + "        libc.syscall.restype = ctypes.c_long\n"
    + "        if True:\n"
    + "            if libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0) == 0:\n"
    + _WORK
    + _WRAP_TAIL,
)


@pytest.mark.parametrize("use_cgroups", ["1", "0"], ids=["cgroup", "process-tree"])
@pytest.mark.parametrize(
    "offload", [REAPED_BY_A_LIVE_HELPER, CLONED_AS_A_SIBLING], ids=["live-helper", "clone-parent"]
)
def test_work_reaped_elsewhere_is_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offload: tuple[str, str], use_cgroups: str
) -> None:
    monkeypatch.setenv(cgroups.CGROUPS_ENV, use_cgroups)
    anchor = "# One layer's cache"
    edits = [offload, (anchor, FORGE_PART2_LENGTHS + anchor)]
    submission = patched_solution(tmp_path / "sub", "transformer_skeleton.py", edits)
    graded = grade_checks(
        submission, tmp_path / "out", "part2", {"2.8", "2.9", "2.11"}, PART2_LIMITS
    )
    assert graded.score("2.8") == graded.test("2.8")["max_score"]  # its tokens are right
    assert graded.score("2.9") == 0, graded.output("2.9")
    assert graded.score("2.11") == 0, graded.output("2.11")
    accounting = graded.results.extra_data["cpu_accounting"]
    offered = cgroups.create("probe")
    if offered is not None:
        offered.remove()
    if use_cgroups == "1" and offered is not None:
        assert accounting == [offered.accounting]
    else:
        assert accounting == [cgroups.PROCESS_TREE]
