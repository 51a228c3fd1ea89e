"""A worker forked by the fork server is the process ``subprocess`` would have started:
same account, limits, namespaces, descriptors, session, folder, environment and exit
statuses; and a server that fails leaves the grader starting workers the old way."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from grader.core.paths import PROJECT_ROOT
from grader.sandbox import forkserver, forkserver_main
from grader.sandbox.confine import Confinement
from grader.sandbox.forkserver import ForkedWorker, ForkServer, server_for, start_interpreter
from grader.sandbox.mounts import mount_isolation
from grader.sandbox.sandbox import (
    MALLOC_SETTINGS,
    Limits,
    Sandbox,
    confinement,
    network_isolation,
)
from grader.sandbox.view import with_view

#: Every test here starts, drops or counts fork servers: with a registry of its own, the
#: server this test worker's gradings share survives it (see ``own_fork_servers``).
pytestmark = pytest.mark.usefixtures("own_fork_servers")


@pytest.fixture
def server(box: Sandbox) -> Iterator[ForkServer]:
    running = ForkServer(("json",), {**box.environment("cpu", 1), "HOME": "/nonexistent"})
    running.start(timeout=60)
    yield running
    running.close()


def spec_for(box: Sandbox) -> Confinement:
    """The confinement a grading gives its worker here: its own view of the files (the
    checkout hidden) where one can be built, the network removed where a namespace can
    be made."""
    spec = confinement(Limits(), box.identity, not network_isolation())
    return with_view(spec, box.root, [PROJECT_ROOT])


def run_probe(box: Sandbox, server: ForkServer | None) -> tuple[dict, bytes]:
    """The probe's facts and its captured output, forked by ``server`` or started."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    probe = str(box.worker_dir / "probe.py")
    launch = {"env": box.environment("cpu", 1), "cwd": str(box.submission_dir)}
    spec = spec_for(box)
    try:
        if server is None:
            argv = [probe, "--in-fd", str(req_r), "--out-fd", str(resp_w), "--tag", "x"]
            proc = start_interpreter(argv, confinement=spec, pass_fds=(req_r, resp_w), **launch)
        else:
            argv = [probe, "--in-fd", "{in_fd}", "--out-fd", "{out_fd}", "--tag", "x"]
            proc = server.spawn(argv=argv, confinement=spec, pass_fds=(req_r, resp_w), **launch)
    finally:
        os.close(req_r)
        os.close(resp_w)
    assert proc.wait(timeout=60) == 0
    facts = json.loads(os.read(resp_r, 1 << 20))
    for space in ("net", "mnt"):  # each worker gets a namespace of its own, or the grader's
        facts[space] = facts[space] != os.readlink(f"/proc/self/ns/{space}")
    output = proc.stdout.read()
    for fd in (req_w, resp_r):
        os.close(fd)
    proc.stdout.close()
    return facts, output


def spawn_exit(box: Sandbox, server: ForkServer, arg: str, script: str = "exit.py") -> ForkedWorker:
    """``exit.py ARG`` (or ``script``) forked by ``server`` (its channel's pipes are closed
    here)."""
    req_r, req_w = os.pipe()
    try:
        return server.spawn(
            argv=[str(box.worker_dir / script), arg],
            env=box.environment("cpu", 1),
            cwd=str(box.submission_dir),
            confinement=spec_for(box),
            pass_fds=(req_r, req_w),
        )
    finally:
        os.close(req_r)
        os.close(req_w)


def test_a_forked_worker_is_the_process_subprocess_would_start(box, server) -> None:
    forked, forked_output = run_probe(box, server)
    started, started_output = run_probe(box, None)
    assert forked == started
    assert forked_output == started_output == b"to stdout\nto stderr\n"
    # and what both are, where this machine allows it
    assert forked["name"] == "__main__" and forked["argv"] == ["--in-fd", "--out-fd", "--tag", "x"]
    assert forked["grader_modules"] == [] and forked["other_fds"] == []
    assert forked["cwd"] == str(box.submission_dir) and forked["stdin"] == "/dev/null"
    assert forked["limits"]["RLIMIT_AS"][0] == Limits().memory_bytes
    assert forked["no_new_privs"] == "1" and forked["session_leader"]
    assert forked["env"] == box.environment("cpu", 1)
    if box.identity.dropped:
        assert forked["uid"] == box.identity.uid and forked["gid"] == box.identity.gid
        assert forked["dumpable"] == 1
    if not network_isolation():
        assert forked["net"]  # a network namespace of its own
    if box.identity.dropped and not mount_isolation():
        assert forked["mnt"]


def test_the_worker_is_forked_from_the_server(box, server) -> None:
    worker = spawn_exit(box, server, "sleep")
    try:
        assert psutil.Process(worker.pid).ppid() == server.proc.pid
        with pytest.raises(subprocess.TimeoutExpired):
            worker.wait(timeout=0.2)
        assert worker.poll() is None
    finally:
        os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL


#: Exits 0 when the libraries the server imported are frozen out of the worker's collections.
FROZEN = """import gc, sys
sys.exit(0 if gc.isenabled() and gc.get_freeze_count() > 1000 else 1)
"""


def test_the_server_whose_heap_its_workers_inherit_starts_with_their_heap_settings(
    server,
) -> None:
    """glibc reads its heap settings once, as a process starts: a forked worker runs on the
    heap of its server, so the server itself must have been started with them."""
    environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
    for name, value in MALLOC_SETTINGS.items():
        assert f"{name}={value}".encode() in environ, name


def test_the_preloaded_libraries_are_frozen_out_of_the_workers_collections(box, server) -> None:
    (box.worker_dir / "exit.py").write_text(FROZEN)
    assert spawn_exit(box, server, "-").wait(timeout=30) == 0


#: Imports a module that builds many objects in cycles through ``preload`` and prints how
#: many collections ran during it, whether the collector is on after, and what it froze.
PRELOAD_COLLECTIONS = """import gc, json, sys
sys.path.insert(0, sys.argv[1])
from grader.sandbox.forkserver_main import preload
runs = []
gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
preload(["many_cycles"])
print(json.dumps({"collections": runs, "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def test_no_collection_runs_while_the_libraries_import(tmp_path: Path) -> None:
    """Each full collection during the imports would walk every object imported so far,
    a quarter of the server's start-up CPU time; the objects are frozen all the same."""
    (tmp_path / "many_cycles.py").write_text(
        "NODES = []\nfor i in range(200_000):\n    node = [i]\n    node.append(node)\n"
        "    NODES.append(node)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_COLLECTIONS, str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["collections"] == [] and seen["enabled"]
    assert seen["frozen"] > 200_000


#: Preloads matplotlib's pyplot with ``MPLCONFIGDIR`` naming a shared folder (a fork
#: server's ``/tmp``) and prints where matplotlib kept its cache and what is left.
PRELOAD_PLOTS = """
import json, os, sys
from grader.sandbox.forkserver_main import preload
preload(["matplotlib.pyplot"])
import matplotlib
cache = matplotlib.get_cachedir()
print(json.dumps({"cache": cache, "exists": os.path.exists(cache),
                  "env": os.environ["MPLCONFIGDIR"], "loaded": "matplotlib.pyplot" in sys.modules}))
"""


def test_a_preloaded_library_keeps_its_cache_in_a_folder_of_the_servers_own(
    tmp_path: Path,
) -> None:
    """matplotlib builds its font list where ``MPLCONFIGDIR`` says: in a fork server that
    is a ``/tmp`` an earlier submission could have written. The trusted server reads and
    writes nothing there, removes its own folder, and leaves its environment as it was."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    planted = shared / "fontlist-v390.json"
    planted.write_text("{not json")
    env = {**os.environ, "MPLCONFIGDIR": str(shared), "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_PLOTS], capture_output=True, text=True, timeout=120,
        cwd=PROJECT_ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["loaded"] and seen["env"] == str(shared)
    assert not Path(seen["cache"]).is_relative_to(shared) and not seen["exists"]
    assert sorted(p.name for p in shared.iterdir()) == [planted.name]
    assert planted.read_text() == "{not json"


#: The start of a line of ``/proc/self/maps``: address range, mode, offset, device, inode.
MAPPED = "7f1c2a000000-7f1c2a200000 r-xp 00000000 08:01 131 "


@pytest.mark.parametrize(
    ("path", "loaded"),
    [
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", True),
        ("/usr/lib64/libcuda.so.1", True),
        ("/opt/torch/lib/libcudart.so.12", False),
        ("/opt/torch/lib/libcudnn.so.9", False),
    ],
)
def test_the_cuda_driver_is_told_apart_from_the_libraries_torch_links(
    path: str, loaded: bool
) -> None:
    maps = f"{MAPPED}/usr/bin/python3.11\n{MAPPED}{path}\n"
    assert forkserver_main.cuda_driver_loaded(maps) is loaded


#: Preloads a module that loads a library named as the CUDA driver (a copy of libm).
PRELOAD_DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from grader.sandbox.forkserver_main import preload
try:
    preload(["loads_driver"])
except RuntimeError as exc:
    print(exc)
"""


def test_a_server_whose_imports_loaded_the_cuda_driver_refuses_to_serve(tmp_path: Path) -> None:
    """A process forked after the CUDA driver was loaded cannot use the GPU: a server for
    GPU workers whose preloads loaded it refuses, and the grader starts its workers anew.
    A CPU worker's server serves on (its workers never use the driver)."""
    mapped = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()]
    libm = next(path for path in mapped if Path(path).name.startswith("libm.so"))
    shutil.copy(libm, tmp_path / "libcuda.so.1")
    (tmp_path / "loads_driver.py").write_text(
        f"import ctypes\nctypes.CDLL({str(tmp_path / 'libcuda.so.1')!r})\n"
    )
    for device, refused in (("cuda", True), ("cpu", False)):
        done = subprocess.run(
            [sys.executable, "-c", PRELOAD_DRIVER, str(tmp_path)],
            capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT,
            env={**os.environ, "KVGRADER_DEVICE": device},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert ("loaded the CUDA driver" in done.stdout) is refused, device


@pytest.mark.parametrize(("arg", "code"), [("3", 3), ("0", 0)])
def test_exit_statuses_are_reported_as_subprocess_reports_them(box, server, arg, code) -> None:
    worker = spawn_exit(box, server, arg)
    assert worker.wait(timeout=30) == code


def test_a_worker_outlives_its_server_and_is_still_waited_for(box, server) -> None:
    """The server dies mid-grading: its worker is the grader's (its subreaper), and its
    exit status is read directly."""
    from grader.sandbox.processes import become_subreaper

    assert become_subreaper()
    worker = spawn_exit(box, server, "sleep")
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 10
    while psutil.Process(worker.pid).ppid() != os.getpid() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL


def test_a_server_that_cannot_start_says_why_and_is_not_tried_again(monkeypatch) -> None:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    for _ in range(2):
        with pytest.raises(forkserver.ForkServerError, match=r"status 1 .*No module named"):
            server_for(("no_such_module_anywhere",), env, timeout=60)
    monkeypatch.setenv(forkserver.SWITCH, "0")
    assert server_for(("json",), env, timeout=60) is None
    monkeypatch.setenv(forkserver.SWITCH, "1")
    assert server_for((), env, timeout=60) is None
    used = server_for(("json",), env, timeout=60)
    assert used is not None and used.alive
    assert server_for(("json",), env, timeout=60) is used  # one server, kept
    other = server_for(("csv",), env, timeout=60)  # json does not serve it: a new one
    assert other is not used and not used.alive  # one at a time


def test_a_server_that_preloads_less_imports_the_rest_and_serves_on(box) -> None:
    """Part 4's libraries hold Part 2's: the server that forked Part 2's workers imports
    transformers too, instead of a new interpreter importing torch again; one that
    cannot is replaced by a new server, which says why where it cannot start either."""
    env = {**box.environment("cpu", 1), "HOME": "/nonexistent"}
    first = server_for(("json",), env, timeout=60)
    assert first is not None
    pid = first.proc.pid
    grown = server_for(("json", "csv"), env, timeout=60)
    assert grown is first and grown.proc.pid == pid and grown.preload == ("json", "csv")
    assert server_for(("json",), env, timeout=60) is first  # still serves the narrower part
    assert spawn_exit(box, grown, "3").wait(timeout=30) == 3  # forks as before
    with pytest.raises(forkserver.ForkServerError, match="No module named"):
        server_for(("json", "csv", "no_such_module_anywhere"), env, timeout=60)
    assert not first.alive


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no thread on one core")
def test_a_server_with_threads_is_refused() -> None:
    """Forking a threaded process can deadlock the child: numpy's OpenBLAS starts a
    thread pool when told it may use two threads."""
    server = ForkServer(("numpy",), {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"})
    with pytest.raises(forkserver.ForkServerError, match="threads"):
        server.start(timeout=60)
    assert not server.alive


def test_a_worker_of_a_server_this_process_closed_is_still_waited_for(box, server) -> None:
    """A grader moving to another part's server closes the old one; a worker of it that
    is still running is waited for directly."""
    from grader.sandbox.processes import become_subreaper

    assert become_subreaper()
    worker = spawn_exit(box, server, "sleep")
    server.close()
    assert psutil.Process(worker.pid).ppid() == os.getpid()
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(timeout=0.1)
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait(timeout=30) == -signal.SIGKILL


#: Exits 0 when ``csv`` was imported in the process it runs in before its script began.
CSV_IMPORTED = """import sys
sys.exit(0 if "csv" in sys.modules else 1)
"""


def test_a_server_imports_the_next_parts_libraries_while_a_worker_runs(box, server) -> None:
    """Asked as a part's worker is forked, the server imports the next part's libraries
    while that worker runs; the next fork takes its answer and comes from the grown server."""
    (box.worker_dir / "csv_imported.py").write_text(CSV_IMPORTED)
    assert spawn_exit(box, server, "-", "csv_imported.py").wait(timeout=30) == 1  # not yet
    running = spawn_exit(box, server, "sleep")
    try:
        server.import_ahead(("json", "csv"))
        assert server.ahead == ("csv",) and server.preload == ("json",)  # not waited for
        readable, _, _ = select.select([server.control], [], [], 60)
        assert readable and running.poll() is None  # answered while the worker runs
        assert spawn_exit(box, server, "-", "csv_imported.py").wait(timeout=30) == 0
        assert server.preload == ("json", "csv") and server.ahead == ()
        server.import_ahead(("csv",))  # imported already: nothing is asked
        assert server.ahead == ()
    finally:
        os.kill(running.pid, signal.SIGKILL)
    assert running.wait(timeout=30) == -signal.SIGKILL


def test_a_server_that_could_not_import_ahead_is_dropped_at_its_next_fork(box, server) -> None:
    """The next fork says why, and the caller starts its worker another way."""
    server.import_ahead(("no_such_module_anywhere",))
    with pytest.raises(forkserver.ForkServerError, match="could not import no_such_module_any"):
        spawn_exit(box, server, "0")
    assert not server.alive


def test_a_server_that_could_not_import_ahead_is_replaced_for_the_next_part(box) -> None:
    env = {**box.environment("cpu", 1), "HOME": "/nonexistent"}
    first = server_for(("json",), env, timeout=60)
    assert first is not None
    first.import_ahead(("no_such_module_anywhere",))
    second = server_for(("json", "csv"), env, timeout=60)
    assert second is not None and second is not first and not first.alive
    assert second.preload == ("json", "csv")
