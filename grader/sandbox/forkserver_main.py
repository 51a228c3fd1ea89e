"""The fork server's own process: trusted, it imports the libraries every worker of a part
imports (torch) once, then forks one worker per request from that state.

A worker started by ``exec`` pays a new interpreter and a torch import (one to three CPU
seconds) each time; a forked one starts in milliseconds. Each child becomes exactly
what ``subprocess`` would have started: its descriptors (``/dev/null``, the output
pipe, the request channel) and nothing else, a session of its own, its folder, the
sandbox's environment, the same :func:`~grader.sandbox.confine.confine` (limits,
namespaces, its own view of the files: a tree of its own or Landlock's rules, no new
privileges, the drop to the worker account), then the worker's ``main.py`` run as
``__main__``, which exits the way an interpreter does. The view is built after the
child has entered its folder, and enters it again inside the view.

The parent (:mod:`grader.sandbox.forkserver`) talks to this process over a Unix
``SOCK_SEQPACKET`` socket, one JSON object per message:

* from the server: ``{"ready": pid, "threads": n}`` once the libraries are imported;
  ``{"spawned": id, "pid": pid}`` for each request; ``{"exited": pid, "code": c}`` when
  a worker ends (``c`` as ``subprocess`` reports it: negative for a signal);
* to the server: ``{"id", "argv", "env", "cwd", "confinement"}`` with three descriptors
  (output, requests in, replies out). ``argv`` may name ``{in_fd}`` and ``{out_fd}``.
  Or ``{"preload": [...]}``: import those too (the next part's libraries), answered by
  ``{"preloaded": true, "threads": n}`` or ``{"preloaded": false, "error": ...}``.

The ``ready`` message also names what the server preloaded and the environment it
imported them in, so that a grader offered a server it did not start (below) can tell
whether it serves its workers.

With ``--shared`` the process is a batch's shared server (:mod:`grader.sandbox.shared`):
it imports once for every grading of a class regrade, and for each ``{"serve": true}``
that carries one descriptor (a grading's end of a new socket pair) forks a server of that
grading's own, answering ``{"forked": pid}``. That server is the one above, talking to its
grading alone: it reaps that grading's workers and their orphans (it is their subreaper),
so what they used is charged to that grading and no other.

Only the standard library and the modules it preloads are imported here, so a worker
holds nothing of the grader but this module, :mod:`grader.sandbox.confine` and the
modules that build the view (``mounts``, ``landlock``, ``visible``), which are unloaded
before the submission runs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import json
import os
import re
import runpy
import select
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from grader.sandbox.confine import Confinement, confine

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
MAX_MESSAGE = 1 << 20
#: What this process has preloaded, in order, and the environment it was started with
#: (torch's import adds to it), told in its ``ready`` message.
LOADED: list[str] = []
STARTED_ENV: dict[str, str] = {}


@dataclass(frozen=True)
class Job:
    """What a forked child runs once it is confined."""

    main: str  # the worker's main.py
    argv: list[str]


def preload(specs: list[str]) -> None:
    """Import each ``module`` or ``module:name,name`` (names read from it, for packages
    that load their members lazily, as transformers does), then freeze what is left in the
    collector's permanent generation: a worker's garbage collections no longer walk the
    libraries' objects (torch's 170,000 cost 70 ms each, against microseconds frozen, and
    check 3.1 collects before each memory reading), nor write to their pages.

    The collector is off while the libraries import, and does not run after: each of its
    full collections walks every object imported so far (a quarter of numpy, torch and
    transformers' import CPU time, 0.7 s), and a collection after these imports finds no
    garbage (0 objects, 0.23 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with private_config():
            for spec in specs:
                module, _, names = spec.partition(":")
                loaded = importlib.import_module(module)
                for name in filter(None, names.split(",")):
                    getattr(loaded, name)
                if spec not in LOADED:
                    LOADED.append(spec)
        refuse_after_cuda()
    finally:
        if enabled:
            gc.enable()
    gc.freeze()


#: The CUDA driver's library as ``/proc/self/maps`` names it once something has loaded it
#: (``libcudart``, which a CUDA build of torch links, loads it only when first used).
CUDA_DRIVER = re.compile(r"/libcuda\.so(\.\d+)*$", re.MULTILINE)


def cuda_driver_loaded(maps: str) -> bool:
    """Whether the memory map ``maps`` (``/proc/self/maps``) holds the CUDA driver."""
    return CUDA_DRIVER.search(maps) is not None


def refuse_after_cuda() -> None:
    """Raise, in a server for GPU workers (``KVGRADER_DEVICE`` is not "cpu"), where an
    import here loaded the CUDA driver (a device count, an availability check): a process
    forked after that cannot use the GPU. The grader then starts its workers as new
    interpreters and says so in the run's warnings. CPU workers never touch the driver,
    so a CPU worker's server on a machine with a GPU serves on."""
    if os.environ.get("KVGRADER_DEVICE", "cpu") == "cpu":
        return
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            loaded = cuda_driver_loaded(maps.read())
    except OSError:
        return
    if loaded:
        raise RuntimeError("a preloaded library loaded the CUDA driver; a fork could not use it")


@contextlib.contextmanager
def private_config() -> Iterator[None]:
    """Libraries that read and write a cache where the environment says (matplotlib's
    font list, under ``MPLCONFIGDIR``: ``/tmp`` in a fork server's environment) do so, while
    they import here, in a folder of this server's own, removed afterwards. A file that an
    earlier grading's submission left in a shared ``/tmp`` is never read by this trusted
    process, and nothing is left behind. What they computed stays in memory; a later
    write to the removed folder fails, which matplotlib only warns about."""
    before = os.environ.get("MPLCONFIGDIR")
    folder = tempfile.mkdtemp(prefix="kvgrader-preload-")
    os.environ["MPLCONFIGDIR"] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MPLCONFIGDIR", None)
        else:
            os.environ["MPLCONFIGDIR"] = before
        shutil.rmtree(folder, ignore_errors=True)


def extend(specs: list[str]) -> dict[str, Any]:
    """Import ``specs`` as well (see :func:`preload`): the answer to the parent's
    ``{"preload": [...]}``, with the thread count a fork must still find at one."""
    try:
        preload(specs)
    except Exception as exc:  # the parent starts a new server instead
        return {"preloaded": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"preloaded": True, "threads": thread_count()}


def thread_count() -> int:
    """This process's threads: a fork is safe at one only."""
    return len(os.listdir("/proc/self/task"))


def send(control: socket.socket, message: dict[str, Any]) -> None:
    control.send(json.dumps(message).encode())


def reap(control: socket.socket, forked: set[int]) -> None:
    """Reap every child that has ended, and report those this server ``forked`` (its
    workers). The orphans a grading's server adopts as their subreaper are reaped in
    silence: a submission that leaves thousands of them must not fill the socket and
    stop the server."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in forked:
            forked.discard(pid)
            send(control, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def wake_on_child() -> tuple[int, int]:
    """A pipe that becomes readable when a child ends (SIGCHLD), for ``select``."""
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    return wake_r, wake_w


def unwake(wake_r: int, wake_w: int) -> None:
    """In a forked child: undo :func:`wake_on_child`."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in (wake_r, wake_w):
        os.close(fd)


def serve(control: socket.socket) -> Job | None:
    """Fork a worker per request until the parent closes the socket (None); in each
    child, return its job once it is confined."""
    wake_r, wake_w = wake_on_child()
    forked: set[int] = set()  # its workers still running
    send(control, ready())
    while True:
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            reap(control, forked)
        if control not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 3)
        if not data:
            return None
        request = json.loads(data)
        if "preload" in request:  # more libraries for the next part's workers
            send(control, extend(request["preload"]))
            continue
        pid = os.fork()
        if pid == 0:
            unwake(wake_r, wake_w)
            os.close(control.fileno())
            return become_worker(request, fds)
        for fd in fds:
            os.close(fd)
        forked.add(pid)
        send(control, {"spawned": request["id"], "pid": pid})


def ready() -> dict[str, Any]:
    """The first message of a server: its pid, threads, preloads and environment."""
    env = STARTED_ENV or dict(os.environ)
    return {"ready": os.getpid(), "threads": thread_count(), "preload": LOADED, "env": env}


def serve_shared(control: socket.socket) -> Job | None:
    """A batch's shared server: fork one server per grading (each on the descriptor its
    request carries) until the batch closes the socket (None); in each forked server,
    return what :func:`serve` returns there."""
    wake_r, wake_w = wake_on_child()
    send(control, ready())
    while True:
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:  # a grading's server ended: reaped now, its pid freed
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            reap(control, set())  # it forked no worker: nothing to report
        if control not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 1)
        if not data:  # the batch is over: its gradings' servers end with them
            with contextlib.suppress(ChildProcessError):
                while True:
                    os.wait()
            return None
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            send(control, {"forked": None, "error": "a request carries one descriptor"})
            continue
        pid = os.fork()
        if pid == 0:
            unwake(wake_r, wake_w)
            control.close()
            os.setsid()  # out of the batch's group: its grading's kill reaches it alone
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            return serve(socket.socket(fileno=fds[0]))
        os.close(fds[0])
        send(control, {"forked": pid})


def keep_only(fds: list[int]) -> None:
    """Close every descriptor but 0, 1, 2 and ``fds``."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in fds:
            with contextlib.suppress(OSError):  # the listing's own descriptor
                os.close(fd)


def become_worker(request: dict[str, Any], fds: list[int]) -> Job:
    """In the forked child: the descriptors, session, folder, environment and
    confinement ``subprocess`` would have given it."""
    output, in_fd, out_fd = fds
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    keep_only([in_fd, out_fd])
    for fd in (in_fd, out_fd):
        os.set_inheritable(fd, True)
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    reset_process_state()
    spec = Confinement.from_json(request["confinement"])
    confine(spec)
    if spec.uid is not None:
        # Changing uid made the process undumpable, which exec would have undone: its
        # /proc files stay the worker account's, as a started worker's are.
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    named = {"{in_fd}": str(in_fd), "{out_fd}": str(out_fd)}
    argv = [named.get(a, a) for a in request["argv"]]
    return Job(main=argv[0], argv=argv)


def reset_process_state() -> None:
    """What a new interpreter would not share with its siblings: the temporary folder
    (read from the new environment) and numpy's global random state."""
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run_worker(job: Job) -> None:
    """Run the worker's ``main.py`` as ``__main__``, as ``python main.py ...`` would."""
    for name in [n for n in sys.modules if n == "grader" or n.startswith("grader.")]:
        del sys.modules[name]
    sys.argv = job.argv
    sys.path[0] = os.path.dirname(job.main)
    runpy.run_path(job.main, run_name="__main__")


def main(argv: list[str] | None = None) -> Job | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--preload", action="append", default=[])
    parser.add_argument("--shared", action="store_true", help="fork a server per grading")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    STARTED_ENV.update(os.environ)
    preload(args.preload)
    return serve_shared(control) if args.shared else serve(control)


if __name__ == "__main__":
    _job = main()
    if _job is None:
        sys.exit(0)
    run_worker(_job)
