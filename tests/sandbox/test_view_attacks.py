"""Whole gradings against the worker's view of the files, with a tree of its own and with
Landlock alone (``KVGRADER_FILE_VIEW``), and with none, where each attack must work: that
is what shows the test could fail. Another checkout of the kit on the machine, readable by
everyone, and world-writable host folders (``/run/lock``, one made here)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.sandbox.landlock import abi_version
from grader.sandbox.sandbox import network_isolation
from grader.sandbox.view import LANDLOCK, MOUNT_NAMESPACE, NONE, VIEW_ENV
from tests.conftest import (
    ATTACK,
    FAST_LIMITS,
    SOLUTION,
    in_param_count,
    patched_solution,
    run_grade,
)
from tests.sandbox.test_view import view_available

pytestmark = [
    ATTACK,
    pytest.mark.skipif(os.geteuid() != 0, reason="the worker account needs a root grader"),
]

KINDS = [
    pytest.param(
        kind,
        marks=pytest.mark.skipif(not view_available(kind), reason=f"no {kind} view here"),
    )
    for kind in (MOUNT_NAMESPACE, LANDLOCK)
]
#: The secret a TA's second clone holds in its history.
SECRET = "SOLVED_IN_HISTORY = 4242"


@pytest.fixture
def host_folders() -> Iterator[tuple[Path, Path]]:
    """A second checkout with its ``.git`` (a committed file the working tree no longer
    has), readable by every account, and a folder anyone may write, under /srv."""
    base = Path(tempfile.mkdtemp(prefix="kvgrader-host-", dir="/srv"))
    clone, open_dir = base / "kv-cache-kit", base / "open"
    clone.mkdir()
    git = ["git", "-C", str(clone), "-c", "user.name=TA", "-c", "user.email=ta@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    (clone / "secret.py").write_text(SECRET + "\n")
    subprocess.run([*git, "add", "secret.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "solution"], check=True)
    (clone / "secret.py").unlink()
    open_dir.mkdir()
    subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
    open_dir.chmod(0o1777)
    yield clone, open_dir
    shutil.rmtree(base)


def _grade(tmp_path: Path, kind: str, code: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(VIEW_ENV, kind)
    submission = patched_solution(tmp_path / "submission", "question1.py", [in_param_count(code)])
    graded = run_grade(
        submission,
        tmp_path / "out",
        parts=["part1"],
        limits=FAST_LIMITS,
        numbers=frozenset({"1.1"}),
    )
    assert graded.results.extra_data["file_view"] == kind
    return graded


@pytest.mark.parametrize("kind", [*KINDS, NONE])
def test_another_checkout_on_the_machine_is_unreadable_from_a_submission(
    tmp_path: Path, host_folders, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone, _ = host_folders
    code = (
        "    import subprocess\n"
        f"    shown = subprocess.run(['git', '-c', 'safe.directory=*', '-C', {str(clone)!r},\n"
        "                            'show', 'HEAD:secret.py'], capture_output=True).stdout\n"
        f"    assert {SECRET!r}.encode() not in shown, 'another checkout is readable'"
    )
    graded = _grade(tmp_path, kind, code, monkeypatch)
    if kind == NONE:  # the attack itself: the machine's files, as the host shows them
        assert "another checkout is readable" in graded.output("1.1")
        assert any("sees the machine's files" in w for w in _warnings(graded))
    else:
        assert graded.score("1.1") == 2, graded.output("1.1")
        assert not any("sees the machine's files" in w for w in _warnings(graded))


def _warnings(graded) -> list[str]:
    return graded.results.extra_data["sandbox_warnings"]


@pytest.mark.parametrize("kind", [*KINDS, NONE])
def test_world_writable_host_folders_keep_nothing_of_the_grading(
    tmp_path: Path, host_folders, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two files of 1 MiB each into ``/run/lock`` and into a folder made world-writable
    here: written nowhere, or in a private tmpfs gone with the worker."""
    _, open_dir = host_folders
    tag = tmp_path.name
    places = [f"/run/lock/kvgrader-{tag}", f"{open_dir}/fill"]
    code = (
        "    for place in " + repr(places) + ":\n"
        "        for i in range(2):\n"
        "            try:\n"
        "                with open(f'{place}-{i}', 'wb') as f: f.write(b'x' * 2**20)\n"
        "            except OSError: pass"
    )
    try:
        graded = _grade(tmp_path, kind, code, monkeypatch)
        left = sorted(str(p) for p in open_dir.iterdir())
        left += sorted(str(p) for p in Path("/run/lock").glob(f"kvgrader-{tag}-*"))
    finally:
        for path in Path("/run/lock").glob(f"kvgrader-{tag}-*"):
            path.unlink()
    assert graded.score("1.1") == 2, graded.output("1.1")
    if kind == NONE:  # the attack itself: what it wrote outlives the grading
        assert len(left) == (4 if Path("/run/lock").is_dir() else 2), left
    else:
        assert left == []


@pytest.mark.skipif(not view_available(LANDLOCK), reason="no Landlock here")
def test_the_reference_solution_scores_full_marks_with_landlock_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VIEW_ENV, LANDLOCK)
    graded = run_grade(SOLUTION, tmp_path / "out")
    lost = {
        t["number"]: t.get("output", "")[:300]
        for t in graded.data["tests"]
        if t["score"] < t["max_score"]
    }
    assert lost == {}
    assert graded.results.extra_data["file_view"] == LANDLOCK
    assert graded.data["score"] == 104  # 100 and the Part 4 bonus


@pytest.mark.skipif(not network_isolation(), reason="a network namespace closes it here")
@pytest.mark.skipif(abi_version() < 4, reason="no Landlock network rights here")
def test_without_a_network_namespace_a_submission_opens_no_tcp_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A default Docker container: no network namespace for the worker, and Landlock
    refuses its TCP connections, to a service of this machine's too."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        code = (
            "    import socket\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'secret')"
        )
        graded = _grade(tmp_path, LANDLOCK, code, monkeypatch)
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever connected
    assert graded.score("1.1") == 0
    assert "PermissionError" in graded.output("1.1")
