"""Hostile submissions inside Gradescope's default memory: a 768 MB memory cgroup.

The grader and its worker run as one process tree in a cgroup limited to 768 MB,
as in Gradescope's default container. Each attack tries to make the trusted
parent allocate far more than the worker sent; the grader must survive it
(exit 0) and write a valid results file with the honest score. The tests need
root and a memory controller (cgroup v1 or v2); elsewhere they skip and say so.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.core.results import validate_results
from tests.conftest import ROOT, in_param_count, patched_solution

LIMIT = 768 * 2**20
V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


def _controller() -> Path | None:
    if os.geteuid() != 0:
        return None
    if (V1 / "memory.limit_in_bytes").is_file():
        return V1
    controllers = V2 / "cgroup.controllers"
    if controllers.is_file() and "memory" in controllers.read_text().split():
        return V2
    return None


CONTROLLER = _controller()
pytestmark = pytest.mark.skipif(
    CONTROLLER is None, reason="needs root and a memory cgroup controller (v1 or v2)"
)


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A fresh memory cgroup limited to ``limit`` bytes, swap included where v1 allows."""
    assert CONTROLLER is not None
    group = CONTROLLER / f"kvgrader-test-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        if CONTROLLER == V1:
            (group / "memory.limit_in_bytes").write_text(str(limit))
            with contextlib.suppress(OSError):  # without swap accounting there is no knob
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        else:
            (group / "memory.max").write_text(str(limit))
            (group / "memory.swap.max").write_text("0")
        yield group
    finally:
        procs = group / ("tasks" if CONTROLLER == V1 else "cgroup.procs")
        for pid in procs.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        with contextlib.suppress(OSError):
            group.rmdir()


def grade_in_768_mb(submission: Path, out: Path) -> tuple[int, dict]:
    """Run ``python -m grader grade`` (Part 1) inside the cgroup; its exit code and results."""
    results = out / "results.json"
    with memory_cgroup(LIMIT) as group:
        procs = group / ("tasks" if CONTROLLER == V1 else "cgroup.procs")
        proc = subprocess.run(
            [sys.executable, "-m", "grader", "grade", str(submission), "--results", str(results),
             "--parts", "part1"],
            cwd=ROOT,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
    data = json.loads(results.read_text())
    validate_results(data)
    return proc.returncode, data


def score(data: dict, number: str) -> float:
    return next(t["score"] for t in data["tests"] if t["number"] == number)


def png_bomb(path: Path, side: int = 13_000) -> None:
    """A small RGBA PNG of ``side`` x ``side`` zero pixels, written row by row: about
    0.6 MB on disk, 676 MB once decoded. Nothing large is ever held here."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    packer = zlib.compressobj(9)
    row = bytes(1 + 4 * side)  # filter byte 0, then RGBA zeros
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 6, 0, 0, 0)))
        f.write(chunk(b"IDAT", idat))
        f.write(chunk(b"IEND", b""))


def test_a_png_that_decodes_to_676_mb(tmp_path: Path) -> None:
    copy = (
        "    import shutil\n"
        "    shutil.copy(Path(__file__).with_name('bomb.png'), path)\n"
        "    return\n"
        '    """'
    )
    submission = patched_solution(
        tmp_path / "submission",
        "question1.py",
        [('    """Plot prefill arithmetic intensity', copy)],
    )
    png_bomb(submission / "bomb.png")
    assert (submission / "bomb.png").stat().st_size < 2**20
    code, data = grade_in_768_mb(submission, tmp_path)
    assert code == 0
    assert score(data, "1.11") == 0 and score(data, "1.1") == 2
    out = next(t["output"] for t in data["tests"] if t["number"] == "1.11")
    assert "more than the grader decodes" in out


REPLY = (
    "import io, json, os, struct, sys\n"
    "fd = int(sys.argv[sys.argv.index('--out-fd') + 1])\n"
    "def send(head, blob=b'', zeros=0):  # zeros are streamed, never held\n"
    "    raw = json.dumps(head).encode()\n"
    "    os.write(fd, struct.pack('>Q', len(raw)) + raw + blob)\n"
    "    chunk = bytes(1 << 20)\n"
    "    for _ in range(zeros // len(chunk)):\n"
    "        os.write(fd, chunk)\n"
)


def _npy_header(descr: str, shape: tuple[int, ...]) -> str:
    return (
        "import numpy as np\n"
        "buf = io.BytesIO()\n"
        f"np.lib.format.write_array_header_1_0(buf, {{'descr': {descr!r}, "
        f"'fortran_order': False, 'shape': {shape!r}}})\n"
        "head = buf.getvalue()\n"
    )


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (
            _npy_header("|V0", (300_000_000,)) + "send({'ok': True, 'ready': True, '__arrays__': "
            "[{'name': 'x', 'nbytes': len(head)}]}, head)\n",
            "zero-size items claiming 3e8 elements",
        ),
        (
            _npy_header("<f4", (125_000_000,)) + "n = len(head) + 500_000_000\n"
            "send({'ok': True, 'ready': True, '__arrays__': [{'name': 'x', 'nbytes': n}]},\n"
            "     head, zeros=500_000_000)\n",
            "a 500 MB reply",
        ),
    ],
)
def test_replies_that_would_take_the_parents_memory(tmp_path: Path, payload: str, why: str) -> None:
    submission = patched_solution(
        tmp_path / "submission", "question1.py", [in_param_count("    pass")]
    )
    target = submission / "question1.py"
    target.write_text(target.read_text().replace("GIB = 2**30", REPLY + payload + "GIB = 2**30", 1))
    code, data = grade_in_768_mb(submission, tmp_path)
    assert code == 0, why
    assert data["score"] == 0  # the worker's channel is refused at once, every check says so
    assert "garbage" in next(t["output"] for t in data["tests"] if t["number"] == "1.1")
