"""Hostile submissions against the grader's own I/O, memory and disk.

The parent must never block on anything the worker controls, never let a small
reply grow into a large allocation, and always write a results file, even when
the worker filled the disk. Each test fails (or hangs, bounded here by a
thread) on a grader without the matching defence.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from grader.core.results import reserve_results, validate_results, write_results
from grader.grading.runner import grade
from grader.judging.images import problem_with_png
from grader.runtime.client import WorkerClient
from grader.runtime.outcomes import SubmissionError
from grader.sandbox.confine import confine
from grader.sandbox.sandbox import (
    Limits,
    Sandbox,
    confinement,
    remove_stray_files,
    remove_tree,
    resolve_identity,
)
from grader.worker.protocol import (
    ProtocolError,
    WriteTimeout,
    read_message,
    write_message,
)
from tests.conftest import (
    FAST_LIMITS,
    PRIVATE_VIEW,
    SOLUTION,
    in_param_count,
    patched_solution,
    run_grade,
)

ROOT_ONLY = pytest.mark.needs_root(reason="needs a root grader")
F_SETPIPE_SZ = 1031


def finishes_within(seconds: float, func, *args, **kwargs):
    """Run ``func`` in a thread; fail (instead of hanging the suite) if it blocks."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = func(*args, **kwargs)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{func.__name__} blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def part1_client(sandbox: Sandbox, limits: Limits) -> WorkerClient:
    """A Part 1 worker on the question1.py already in ``sandbox``'s submission folder."""
    sandbox.hand_over()
    return WorkerClient(
        part="part1",
        module_file="question1.py",
        submission_dir=str(sandbox.submission_dir),
        sandbox=sandbox,
        limits=limits,
    )


# ------------------------------------------------------------- blocking the parent


def test_a_fifo_where_the_plot_goes_does_not_block_the_grader(tmp_path: Path) -> None:
    submission = patched_solution(
        tmp_path / "submission",
        "question1.py",
        [
            (
                '    """Plot prefill arithmetic intensity',
                '    __import__("os").mkfifo(path)\n    return\n    """',
            )
        ],
    )
    graded = finishes_within(
        120, run_grade, submission, tmp_path / "out", parts=["part1"], limits=FAST_LIMITS
    )
    assert graded.score("1.11") == 0
    assert "not a regular file" in graded.output("1.11")
    assert graded.score("1.1") == 2  # the rest of the part is graded as usual


def test_a_write_to_a_reader_that_stopped_reading_gives_up_at_its_deadline() -> None:
    r, w = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(r, F_SETPIPE_SZ, 4096)  # what a worker can do to its end of the pipe
        os.set_blocking(w, False)
        started = time.monotonic()
        with pytest.raises(WriteTimeout):
            write_message(w, {"op": "x"}, {"a": np.zeros(1 << 16)}, deadline=started + 0.5)
        assert time.monotonic() - started < 5
    finally:
        os.close(r)
        os.close(w)


def test_a_worker_that_stops_reading_requests_costs_one_timeout(tmp_path: Path) -> None:
    """The worker shrinks its request pipe to one page and never reads again."""
    stop_reading = (
        "import fcntl, sys, time\n"
        "fcntl.fcntl(int(sys.argv[sys.argv.index('--in-fd') + 1]), 1031, 4096)\n"
        "sys.modules['__main__'].read_message = lambda *a, **k: time.sleep(3600)\n"
    )
    sandbox = Sandbox.create()
    try:
        (sandbox.submission_dir / "question1.py").write_text(stop_reading)
        client = part1_client(sandbox, Limits(request_timeout_s=2.0, startup_timeout_s=30.0))
        big = {"blob": np.zeros(1 << 18)}  # 2 MiB: far more than the shrunken pipe holds
        with pytest.raises(SubmissionError) as info:
            finishes_within(60, client.request, {"op": "call"}, big, what="param_count(spec)")
        assert info.value.kind == "timeout"
        assert "stopped reading" in str(info.value)
        client.stop()
    finally:
        sandbox.cleanup()


# ------------------------------------------------------------ memory amplification


def _channel(raw: bytes):
    r, w = os.pipe()
    threading.Thread(target=lambda: (os.write(w, raw), os.close(w)), daemon=True).start()
    return r


def _message(header: bytes, blob: bytes = b"", name: str = "x") -> bytes:
    if blob:
        spec = json.dumps([{"name": name, "nbytes": len(blob)}])
        header = header[:-1] + b', "__arrays__": ' + spec.encode() + b"}"
    return struct.pack(">Q", len(header)) + header + blob


def _npy(dtype: str, shape: tuple[int, ...], payload: bytes) -> bytes:
    head = {"descr": dtype, "fortran_order": False, "shape": shape}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, head)
    return buf.getvalue() + payload


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (_message(b"[" * 400_000 + b"]" * 400_000), "4e5-deep JSON"),
        (_message(b'{"x": [' + b"{}," * 400_000 + b"{}]}"), "1.2 MB of empty objects"),
        (_message(b'{"n": ' + b"9" * 5000 + b"}"), "a 5000-digit integer"),
        (_message(b'{"ok": true}', _npy("|V0", (300_000_000,), b"")), "zero-size items"),
        (_message(b'{"ok": true}', _npy("<f4", (10**6, 10**6), b"\0" * 64)), "a false shape"),
        (_message(b'{"ok": true}', _npy("|O", (1,), b"\0" * 8)), "objects"),
        (_message(b'{"ok": true}', _npy("<U8", (2,), b"\0" * 64)), "strings"),
    ],
)
def test_replies_that_would_blow_up_the_parent_are_protocol_errors(raw: bytes, why: str) -> None:
    fd = _channel(raw)
    try:
        with pytest.raises(ProtocolError):
            read_message(fd, deadline=time.monotonic() + 10)
    finally:
        os.close(fd)


def test_plain_arrays_still_arrive_writable_and_exact() -> None:
    r, w = os.pipe()
    want = np.arange(12, dtype=np.float32).reshape(3, 4).T  # Fortran order
    threading.Thread(target=write_message, args=(w, {"ok": True}, {"a": want}), daemon=True).start()
    header, arrays = read_message(r, deadline=time.monotonic() + 10)
    os.close(r)
    os.close(w)
    assert header == {"ok": True}
    np.testing.assert_array_equal(arrays["a"], want)
    arrays["a"][0, 0] = 1.0  # student code may write into what it is given


def test_the_reply_cap_fits_a_768_mb_container() -> None:
    assert Limits().max_response_bytes * 3 < 768 * 2**20 // 2


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_small_png_claiming_a_huge_canvas_is_not_decoded(tmp_path: Path) -> None:
    from PIL import Image

    path = tmp_path / "plot.png"
    Image.new("1", (13_000, 13_000)).save(path)  # a few kB on disk, 676 MB as RGBA
    assert path.stat().st_size < 200_000
    assert "more than the grader decodes" in problem_with_png(path)


# ------------------------------------------------------------------ privileges


def test_the_worker_can_never_gain_privileges() -> None:
    """No new privileges: ``sg`` (setuid root) cannot hand the worker another group."""
    spec = confinement(Limits(), resolve_identity())
    proc = subprocess.run(
        ["grep", "NoNewPrivs", "/proc/self/status"],
        preexec_fn=lambda: confine(spec),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.stdout.split() == ["NoNewPrivs:", "1"]


# ------------------------------------------------------------------------ disk


def test_the_results_file_is_written_over_its_reservation_on_a_full_disk(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "results" / "results.json"
    reserve_results(path, "placeholder")
    validate_results(json.loads(path.read_text()))  # valid from the first moment

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("grader.core.results.tempfile.mkstemp", disk_full)
    write_results({"score": 7.0, "output": "done", "tests": []}, path)
    assert json.loads(path.read_text())["score"] == 7.0


@ROOT_ONLY
def test_a_submission_that_fills_the_disk_still_gets_its_results(tmp_path: Path) -> None:
    """/tmp and the results folder on one small file system, filled by the worker."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fill = (
            "    import os\n"
            f"    with open({str(disk / 'junk')!r}, 'wb') as f:\n"
            "        try:\n"
            "            while True: f.write(b'x' * 2**20)\n"
            "        except OSError: pass"
        )
        os.chmod(disk, 0o1777)
        submission = patched_solution(
            tmp_path / "submission", "question1.py", [in_param_count(fill)]
        )
        results = disk / "results" / "results.json"
        graded = grade(submission, results_path=results, parts=["part1"], limits=FAST_LIMITS)
        data = json.loads(results.read_text())
        validate_results(data)
        assert graded is not None and data["score"] == graded.score > 0
        by_number = {t["number"]: t for t in data["tests"]}
        assert by_number["1.6"]["score"] == by_number["1.6"]["max_score"]  # untouched checks
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@ROOT_ONLY
def test_files_the_worker_leaves_in_shared_temp_folders_are_removed(tmp_path: Path) -> None:
    identity = resolve_identity()
    place = tmp_path / "shm"
    place.mkdir()
    mine = place / "leftover"
    mine.write_text("x")
    os.chown(mine, identity.uid, identity.gid)
    other = place / "someone-else"
    other.write_text("y")
    assert remove_stray_files(identity.uid, (place,)) == [mine]
    assert other.exists() and not mine.exists()


def test_a_thousand_folders_deep_upload_is_refused(tmp_path: Path) -> None:
    submission = tmp_path / "submission"
    shutil.copytree(SOLUTION, submission, ignore=shutil.ignore_patterns("__pycache__"))
    deep = submission.joinpath(*["d"] * 1100)
    subprocess.run(["mkdir", "-p", str(deep)], check=True)
    try:
        (deep / "x.txt").write_text("deep")
        graded = run_grade(submission, tmp_path / "out", parts=["part1"], limits=FAST_LIMITS)
        assert graded.data["score"] == 20  # graded as usual
        assert "folders nested deeper than" in graded.data["output"]
    finally:  # pytest's own clean-up of tmp_path recurses and cannot remove it
        subprocess.run(["rm", "-rf", str(submission)], check=True)


def test_a_thousand_folders_deep_tree_left_by_the_worker_is_removed(tmp_path: Path) -> None:
    top = tmp_path / "sandbox"
    subprocess.run(["mkdir", "-p", str(top.joinpath(*["d"] * 1100))], check=True)
    try:
        remove_tree(top)
        assert not top.exists()
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=True)


# ------------------------------------------------------------ the worker's view


@PRIVATE_VIEW
def test_the_worker_sees_neither_the_checkout_nor_other_gradings(grade_patched) -> None:
    """The checkout's .git holds the solution in its history; /tmp holds other sandboxes."""
    from grader.core.paths import PROJECT_ROOT

    neighbour = Path(tempfile.mkdtemp(prefix="kvgrade-neighbour-"))
    (neighbour / "results.json").write_text("{}")
    os.chmod(neighbour, 0o755)
    try:
        code = (
            "    import os\n"
            f"    seen = set(os.listdir({str(PROJECT_ROOT)!r})) - {{'.venv'}}\n"
            "    assert not seen, f'the checkout is visible: {sorted(seen)[:5]}'\n"
            f"    assert not os.path.exists({str(neighbour)!r}), 'another sandbox is visible'"
        )
        graded = grade_patched([in_param_count(code)], numbers=frozenset({"1.1"}))
    finally:
        shutil.rmtree(neighbour)
    assert graded.score("1.1") == 2, graded.output("1.1")


@PRIVATE_VIEW
def test_the_worker_cannot_fill_the_machines_temp_folders(grade_patched) -> None:
    """Ten 32 MiB files (each under the file-size limit) into /tmp: the private tmpfs
    stops them at 256 MiB, and nothing reaches the machine's /tmp."""
    code = (
        "    import os\n"
        "    total = 0\n"
        "    for i in range(10):\n"
        "        try:\n"
        "            with open(f'/tmp/fill{i}', 'wb') as f:\n"
        "                for _ in range(32): total += f.write(b'x' * 2**20)\n"
        "        except OSError: pass\n"
        "    for i in range(10):\n"
        "        if os.path.exists(f'/tmp/fill{i}'): os.unlink(f'/tmp/fill{i}')\n"
        "    assert total <= 256 * 2**20, f'{total} bytes written to /tmp'"
    )
    graded = grade_patched([in_param_count(code)], numbers=frozenset({"1.1"}))
    assert graded.score("1.1") == 2, graded.output("1.1")
    assert not list(Path("/tmp").glob("fill*"))


# ------------------------------------------------------- the worker's own modules


def test_submission_files_named_like_the_workers_modules_change_nothing(tmp_path: Path) -> None:
    submission = patched_solution(tmp_path / "submission", "question1.py", [])
    for name in ("adapter_part1.py", "protocol.py", "values.py"):
        (submission / name).write_text("raise RuntimeError('the worker imported me')\n")
    graded = run_grade(submission, tmp_path / "out", parts=["part1"], limits=FAST_LIMITS)
    assert graded.data["score"] == 20


def test_timed_requests_look_like_any_other(tmp_path: Path, monkeypatch) -> None:
    import grader.runtime.client as client_module

    sent: list[dict] = []
    real = client_module.write_message

    def spy(fd, header, arrays=None, **kwargs):
        sent.append(dict(header))
        return real(fd, header, arrays, **kwargs)

    monkeypatch.setattr(client_module, "write_message", spy)
    sandbox = Sandbox.create()
    try:
        shutil.copy(SOLUTION / "question1.py", sandbox.submission_dir / "question1.py")
        client = part1_client(sandbox, FAST_LIMITS)
        call = {"op": "call", "func": "attention_flops", "args": [], "kwargs": {}}
        for timed in (True, False):  # whether the call succeeds does not matter here
            with contextlib.suppress(SubmissionError):
                client.request(call, what="attention_flops", timed=timed)
        client.stop()
    finally:
        sandbox.cleanup()
    assert len(sent) == 2 and sent[0].keys() == sent[1].keys()
    assert "timed" not in sent[0]


# ------------------------------------------------------------------- the watchdog


def test_the_whole_grading_has_a_deadline(tmp_path: Path) -> None:
    """Every call sleeps, none past the request timeout: the run's budget stops it.

    The first request (1.10's table, which calls ``param_count`` several times) runs past
    the budget and would reach its own limit only after it: with a limit near the
    budget's end the two met, and whichever the grader saw first named the check's end.
    """
    slow = patched_solution(
        tmp_path / "submission",
        "question1.py",
        [in_param_count("    import time\n    time.sleep(2.5)")],
    )
    limits = Limits(request_timeout_s=8.0, startup_timeout_s=8.0, grading_timeout_s=4.0)
    started = time.monotonic()
    graded = finishes_within(120, run_grade, slow, tmp_path / "out", parts=["part1"], limits=limits)
    assert time.monotonic() - started < 60
    assert "ran past its 4 s budget" in graded.data["output"]
    assert graded.data["score"] < 20
    stopped = [t for t in graded.data["tests"] if "ran past its" in t.get("output", "")]
    assert stopped and all(t["score"] == 0 for t in stopped)
    # The check cut short by the deadline names the deadline, never the submission's exit.
    cut = [t for t in stopped if "stopped before it finished" in t["output"]]
    assert cut and "4 s time budget" in cut[0]["output"]
    assert not any("os._exit" in t.get("output", "") for t in graded.data["tests"])


def test_a_request_the_deadline_stopped_names_the_deadline_when_its_limit_passes_too() -> None:
    """The watchdog's kill has not closed the channel when the request's own limit passes:
    the deadline came first, so the check names it, never the submission's speed."""
    sandbox = Sandbox.create()
    try:
        (sandbox.submission_dir / "question1.py").write_text(
            "import time\n\ndef attention_flops(*args, **kwargs):\n    time.sleep(60)\n"
        )
        client = part1_client(sandbox, Limits(request_timeout_s=2.0, startup_timeout_s=30.0))
        with contextlib.suppress(SubmissionError):  # the worker started and imported first
            client.request({"op": "none"}, what="nothing")
        call = {"op": "call", "func": "attention_flops", "args": [], "kwargs": {}}
        timer = threading.Timer(0.5, sandbox.expired.set)  # a deadline whose kill is late
        timer.start()
        with pytest.raises(SubmissionError) as info:
            finishes_within(60, client.request, call, what="attention_flops(N)")
        timer.join()
        client.stop()
    finally:
        sandbox.cleanup()
    assert info.value.kind == "timeout"
    assert "stopped before it finished: the whole grading ran past" in str(info.value)
    assert "infinite loop" not in str(info.value)


@PRIVATE_VIEW
def test_a_checkout_inside_tmp_keeps_its_interpreter_and_the_sandbox(tmp_path: Path) -> None:
    """A fresh clone under /tmp: /tmp's scratch tmpfs covers the checkout already."""
    from grader.sandbox.mounts import apply, plan_for

    checkout, box = tmp_path / "checkout", tmp_path / "kvgrade-box"
    (checkout / ".venv").mkdir(parents=True)
    (checkout / ".venv" / "marker").write_text("venv")
    (checkout / "secret").write_text("solution")
    box.mkdir()
    plan = plan_for(box, [checkout], [checkout / ".venv"])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child builds the view and reports what it sees
        os.close(r)
        try:
            apply(plan)
            seen = {
                "checkout": sorted(os.listdir(checkout)),
                "venv": (checkout / ".venv" / "marker").read_text(),
                "box": box.is_dir(),
            }
        except OSError as exc:
            seen = {"error": str(exc)}
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        seen = json.loads(f.read())
    os.waitpid(pid, 0)
    assert seen == {"checkout": [".venv"], "venv": "venv", "box": True}
