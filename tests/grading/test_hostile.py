"""The hostile-submission corpus: one submission per attack, graded end to end.

Each test asserts the exact outcome: the attacked checks score zero with a
message a student can act on, the other checks are still graded, the results
file is valid (``run_grade`` validates it) and the grading run stays bounded.
Attacks already covered elsewhere are listed in docs/threat-model.md
(reading root-only files and the hidden cases, writing the results folder,
hangs, exits inside a function, memory, process limits, flooding output).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import psutil
import pytest

from grader.core.paths import PROJECT_ROOT, TEST_CASES
from grader.sandbox.sandbox import Limits, network_isolation
from tests.conftest import (
    FAST_LIMITS,
    PART2_LIMITS,
    SOLUTION,
    in_param_count,
    patched_solution,
    refused,
    run_grade,
)

ROOT_ONLY = pytest.mark.needs_root(reason="containment needs a root grader")
BOUND_S = 120  # every hostile run must end well within Gradescope's 10 minutes


def bounded(graded) -> None:
    assert graded.data["execution_time"] < BOUND_S


def at_import(code: str) -> tuple[str, str]:
    """An edit that runs ``code`` when question1.py is imported."""
    anchor = "GIB = 2**30"
    return anchor, f"{code}\n{anchor}"


# ------------------------------------------------------------- reading secrets


@ROOT_ONLY
def test_reading_the_reference_solution_is_refused(grade_patched) -> None:
    target = PROJECT_ROOT / "solution" / "question1.py"
    graded = grade_patched([in_param_count(f"    return len(open({str(target)!r}).read())")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))
    assert graded.score("1.6") == 1  # everything that does not call it is still graded
    bounded(graded)


@ROOT_ONLY
def test_hidden_cases_cannot_be_found_through_proc(grade_patched) -> None:
    # The parent's command line is world-readable; its working directory is not.
    code = (
        "    import os\n"
        "    return len(open(f'/proc/{os.getppid()}/cwd/test_cases/hidden/part1.json').read())"
    )
    graded = grade_patched([in_param_count(code)])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))
    assert 0 < graded.score("1.12") <= 2
    bounded(graded)


# ---------------------------------------------------------- forging the results


@ROOT_ONLY
def test_results_forged_directly_or_by_a_process_that_outlives_the_worker(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o755)  # as Gradescope's results folder: readable, writable by root only
    results = out / "results.json"
    forged = '{"score": 1000, "tests": []}'
    marker = "kvgrade-hostile-daemon"
    daemon = (
        "import os, time\n"
        "os.setsid()\n"
        "for _ in range(600):\n"
        "    time.sleep(0.1)\n"
        "    try:\n"
        f"        open({str(results)!r}, 'w').write({forged!r})\n"
        "    except OSError:\n"
        "        pass\n"
    )
    code = (
        "    import subprocess, sys\n"
        "    try:\n"
        f"        open({str(results)!r}, 'w').write({forged!r})\n"
        "    except OSError:\n"
        "        pass\n"
        f"    subprocess.Popen([sys.executable, '-c', {daemon!r}, {marker!r}],\n"
        "                     start_new_session=True, stdout=subprocess.DEVNULL,\n"
        "                     stderr=subprocess.DEVNULL)"
    )
    submission = patched_solution(tmp_path / "submission", "question1.py", [in_param_count(code)])
    graded = run_grade(submission, out, parts=["part1"], limits=FAST_LIMITS)
    time.sleep(0.5)
    assert graded.data["score"] == 20  # the daemon did not change the answer or the file
    assert "1000" not in results.read_text()
    survivors = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert survivors == []
    bounded(graded)


# ------------------------------------------------------------------- exiting


@pytest.mark.parametrize("call", ["import os; os._exit(0)", "import sys; sys.exit(0)"])
def test_exit_at_import_fails_the_part_with_a_message(grade_patched, call: str) -> None:
    graded = grade_patched([at_import(call)])
    assert graded.data["score"] == 0
    output = graded.output("1.1")
    assert "could not be loaded" in output or "sys.exit" in output
    assert len(graded.data["tests"]) == 13
    bounded(graded)


# ---------------------------------------------------------- exhausting resources


def test_sleeping_past_the_timeout(grade_patched) -> None:
    # Part 1 answers in milliseconds: a 2 s timeout, waited out once per function that
    # calls the sleeping one.
    limits = Limits(request_timeout_s=2.0, startup_timeout_s=FAST_LIMITS.startup_timeout_s)
    graded = grade_patched([in_param_count("    import time; time.sleep(3600)")], limits=limits)
    assert graded.score("1.1") == 0
    outputs = "\n".join(t.get("output", "") for t in graded.data["tests"])
    assert f"did not finish within {limits.request_timeout_s:g} s" in outputs
    assert "already ran past the time limit" in graded.output("1.1")  # not waited for twice
    assert graded.score("1.6") == 1
    bounded(graded)


@ROOT_ONLY
def test_fork_bomb_is_contained(grade_patched) -> None:
    code = "    import os\n    while True:\n        os.fork()"
    graded = grade_patched([in_param_count(code)], limits=Limits(
        request_timeout_s=5.0, startup_timeout_s=8.0, max_processes=64
    ))  # fmt: skip
    assert graded.score("1.1") == 0
    assert graded.score("1.6") == 1
    bounded(graded)


def test_printing_100_megabytes(grade_patched) -> None:
    code = "    import sys\n    for _ in range(100):\n        sys.stdout.write('x' * 2**20)"
    graded = grade_patched([in_param_count(code)])
    assert graded.score("1.1") == 2  # printing is allowed; the answer is still right
    assert len(str(graded.data)) < 200_000
    bounded(graded)


# ------------------------------------------------------ tampering in the worker


def test_monkeypatching_comparisons_in_the_worker_changes_nothing(tmp_path: Path) -> None:
    # Wrong logits (scores divided by d_model), plus every comparison helper patched.
    patch = (
        "import numpy.testing, torch\n"
        "torch.allclose = lambda *a, **k: True\n"
        "torch.equal = lambda *a, **k: True\n"
        "numpy.testing.assert_allclose = lambda *a, **k: None\n"
        "import numpy\nnumpy.allclose = lambda *a, **k: True\n"
    )
    graded = grade_part2(
        tmp_path, [("/ math.sqrt(self.d_model)", "/ self.d_model")], patch, numbers={"2.2"}
    )
    assert graded.score("2.2") == 0
    assert "divides the attention scores by d_model" in graded.output("2.2")


def test_patching_the_clock_does_not_fake_the_benchmark(tmp_path: Path) -> None:
    # A cache that recomputes the prefix, with a frozen clock in the worker.
    patch = "import time\ntime.perf_counter = lambda: 0.0\ntime.time = lambda: 0.0\n"
    graded = grade_part2(tmp_path, [("if not use_cache:", "if True:")], patch, numbers={"2.11"})
    assert graded.score("2.11") == 0
    assert "speedup" in graded.output("2.11")


def test_always_equal_objects_are_rejected(grade_patched, tmp_path: Path) -> None:
    cls = "    class Same:\n        def __eq__(self, other): return True\n"
    graded = grade_patched([in_param_count(cls + "    return Same()")], numbers=frozenset({"1.1"}))
    assert graded.score("1.1") == 0
    assert "must return an int, got an object of type Same" in graded.output("1.1")
    forward = (
        "        class Same:\n"
        "            def __eq__(self, other): return True\n"
        "        return Same(), new_past_kv"
    )
    graded = grade_part2(
        tmp_path, [("        return logits, new_past_kv", forward)], numbers={"2.2"}
    )
    assert graded.score("2.2") == 0
    assert "must be a torch.Tensor" in graded.output("2.2")


def test_a_crafted_pickle_on_the_reply_channel_is_refused(grade_patched) -> None:
    # The worker's reply pipe is on its command line: write a message whose array
    # is a pickled object, before the real handshake.
    code = (
        "import io, json, os, struct, sys\nimport numpy as np\n"
        "fd = int(sys.argv[sys.argv.index('--out-fd') + 1])\n"
        "buf = io.BytesIO(); np.save(buf, np.array([object()], dtype=object), allow_pickle=True)\n"
        "blob = buf.getvalue()\n"
        "head = json.dumps({'ok': True, 'ready': True,\n"
        "                   '__arrays__': [{'name': 'x', 'nbytes': len(blob)}]}).encode()\n"
        "os.write(fd, struct.pack('>Q', len(head)) + head + blob)\n"
    )
    graded = grade_patched([at_import(code)])
    assert graded.data["score"] == 0
    assert "garbage" in graded.output("1.1")
    bounded(graded)


# --------------------------------------------------------------- the file system


def test_a_symlink_to_the_test_data_is_not_followed(tmp_path: Path) -> None:
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "question1.py").symlink_to(SOLUTION / "question1.py")
    (submission / "answers.json").symlink_to(TEST_CASES / "hidden" / "part1.json")
    graded = run_grade(submission, tmp_path / "out", parts=["part1"], limits=FAST_LIMITS)
    assert graded.data["score"] == 0
    assert "question1.py is not in your submission" in graded.output("1.1")
    assert "Not graded: question1.py" in graded.data["output"]
    assert "answers.json" in graded.data["output"]


# -------------------------------------------------------------------- network


@ROOT_ONLY
@pytest.mark.skipif(bool(network_isolation()), reason="no network namespace on this kernel")
def test_the_worker_has_no_network(grade_patched) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(15)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    code = (
        "    import socket\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'secret')"
    )
    graded = grade_patched([in_param_count(code)])
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)  # wakes the pending accept() now, not in 15 s
    server.close()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert accepted == []
    assert graded.score("1.1") == 0
    assert "Error" in graded.output("1.1")  # ConnectionRefusedError / OSError: unreachable
    bounded(graded)


# ---------------------------------------------------------------------- helper


def grade_part2(
    tmp_path: Path,
    edits: list[tuple[str, str]],
    prelude: str = "",
    numbers: set[str] | None = None,
):
    """Grade Part 2 of the solution with ``edits``, and ``prelude`` run at import (only
    the checks ``numbers`` when given)."""
    anchor = "# One layer's cache"
    if prelude:
        edits = [*edits, (anchor, prelude + anchor)]
    submission = patched_solution(
        tmp_path / f"part2-{len(list(tmp_path.iterdir()))}", "transformer_skeleton.py", edits
    )
    return run_grade(
        submission,
        tmp_path / f"out-{submission.name}",
        parts=["part2"],
        limits=PART2_LIMITS,
        numbers=frozenset(numbers) if numbers is not None else None,
    )
