"""Starting workers from a fork server: the parent's side (see :mod:`forkserver_main`).

A :class:`ForkServer` is a child of the grader that has imported a part's libraries once;
:meth:`ForkServer.spawn` gives a :class:`ForkedWorker`, the part of ``subprocess.Popen``
the worker client uses (``pid``, ``stdout``, ``wait``, ``poll``). At most one server
lives at a time in a grader (each holds its own torch, and Gradescope's container is
small); a server that cannot start or stops answering is dropped, and the caller starts
its worker with ``subprocess`` as before. ``KVGRADER_FORKSERVER=0`` turns it off.

A class regrade offers each grading a server it did not start (:mod:`grader.sandbox.shared`):
a descriptor named by ``KVGRADER_SHARED_FORKSERVER``, the grading's end of a socket to a
server forked for it alone from one that imported the libraries once for the whole batch.
:func:`server_for` adopts it where it preloads what is needed in the same environment.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from grader.core.paths import PACKAGE
from grader.sandbox.confine import Confinement, confine, lift_data_ceiling
from grader.sandbox.forkserver_main import MAX_MESSAGE
from grader.sandbox.processes import STARTED

SWITCH = "KVGRADER_FORKSERVER"
#: The variable naming the descriptor of a server offered to this grading (a batch's).
OFFERED = "KVGRADER_SHARED_FORKSERVER"
#: How long a server may take to import its libraries (trusted code: no student's
#: import timeout applies, but a machine busy enough to exceed this had better start
#: its workers the old way).
START_TIMEOUT_S = 120.0
#: How long a live server may take to fork one worker before it is dropped as hung.
FORK_TIMEOUT_S = 10.0
#: The server's module, run as ``python -m`` (so a zip of the grading path must hold it).
SERVER_MODULE = "grader.sandbox.forkserver_main"


class ForkServerError(RuntimeError):
    """The server did not start or stopped answering: start the worker another way."""


@dataclass
class ForkedWorker:
    """A worker forked by a :class:`ForkServer`, seen through ``Popen``'s interface."""

    pid: int
    stdout: Any  # the read end of its output pipe (a binary file)
    server: ForkServer
    returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status as ``Popen.wait`` gives it; ``subprocess.TimeoutExpired``
        after ``timeout`` seconds."""
        if self.returncode is None:
            self.returncode = self.server.wait(self.pid, timeout)
        return self.returncode

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0)
        return None


@dataclass
class ForkServer:
    """One server process and the socket to it."""

    preload: tuple[str, ...]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    control: socket.socket | None = None
    errors: Any = None  # the server's stderr (a temporary file)
    exited: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_id: int = 0
    adopted_pid: int | None = None  # a server offered to this process, not its child
    #: Libraries asked for by :meth:`import_ahead` whose answer is not yet taken, and
    #: that answer where it came while another was awaited.
    ahead: tuple[str, ...] = ()
    ahead_answer: dict[str, Any] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id (it reaps the workers it forks)."""
        return self.proc.pid if self.proc is not None else self.adopted_pid

    @classmethod
    def adopt(cls, fd: int, timeout: float = START_TIMEOUT_S) -> ForkServer:
        """The server at the other end of socket ``fd``, started by someone else (a
        batch's shared server forked it for this grading), once it has said it is ready.
        :class:`ForkServerError` where it does not, or runs threads."""
        control = socket.socket(fileno=fd)
        control.set_inheritable(False)
        server = cls((), {}, control=control)
        try:
            ready = server._receive(timeout, lambda m: "ready" in m)
        except ForkServerError:
            ready = None
        if ready is None or ready.get("threads") != 1:
            server.close()
            why = "did not say it was ready" if ready is None else "runs threads"
            raise ForkServerError(f"the offered fork server {why}")
        server.preload = tuple(ready["preload"])
        server.env = dict(ready["env"])
        server.adopted_pid = int(ready["ready"])
        return server

    def start(
        self,
        timeout: float = START_TIMEOUT_S,
        *,
        python: str = sys.executable,
        shared: bool = False,
    ) -> None:
        """Start the server with ``python`` and wait until it has imported its libraries;
        ``shared``: a batch's server, which forks a server per grading
        (:mod:`grader.sandbox.shared`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        errors = tempfile.TemporaryFile()  # noqa: SIM115  (kept while the server lives)
        command = [python, "-E", "-s", "-u", "-B", "-m", SERVER_MODULE]
        command += ["--shared"] if shared else []
        command += ["--control-fd", str(theirs.fileno())]
        command += [f"--preload={spec}" for spec in self.preload]
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                pass_fds=(theirs.fileno(),),
                cwd=PACKAGE.parent,  # where ``-m`` finds the ``grader`` package
                env=self.env,
                start_new_session=True,
                preexec_fn=lift_data_ceiling,  # the grader's memory ceiling is its own
            )
        finally:
            theirs.close()
        self.errors = errors
        STARTED.add(self.proc.pid)  # never an orphan whose CPU time is a worker's
        self.control = ours
        try:
            ready = self._receive(timeout, lambda m: "ready" in m)
        except ForkServerError:
            code = self.proc.wait(timeout=5)
            self.errors.seek(0)
            lines = self.errors.read().decode(errors="replace").strip().splitlines()
            raise ForkServerError(
                f"it exited with status {code} while it started ({lines[-1] if lines else ''})"
            ) from None
        if ready is None:
            raise ForkServerError(f"it did not start in {timeout:g} s")
        if ready["threads"] != 1:  # forking a threaded process is not safe
            self.close()
            raise ForkServerError(f"it runs {ready['threads']} threads, and forking them is unsafe")

    def extend(self, specs: tuple[str, ...], timeout: float = START_TIMEOUT_S) -> None:
        """Have the live server import ``specs`` as well, and serve parts that need them:
        one interpreter and one torch import for Parts 2 to 4, not one per part's
        libraries. :class:`ForkServerError` where it could not (the caller drops it)."""
        assert self.control is not None
        with self.lock:
            self._finish_ahead(timeout)
            missing = [s for s in specs if s not in self.preload]
            if not missing:
                return
            try:
                self.control.send(json.dumps({"preload": missing}).encode())
            except OSError as exc:
                raise ForkServerError(f"the server is gone: {exc}") from None
            answer = self._receive(timeout, lambda m: "preloaded" in m)
            self._accept(tuple(missing), answer, timeout)

    def import_ahead(self, specs: tuple[str, ...]) -> None:
        """Have the server import ``specs`` now, without waiting for it: the next part's
        libraries, while this part's worker (forked already) runs, on another core where the
        machine has one. The answer is taken by the next request that needs the server
        (:meth:`extend`, :meth:`spawn`), which waits for the import to end first."""
        if self.control is None:
            return
        with self.lock:
            if self.ahead:
                return
            missing = tuple(s for s in specs if s not in self.preload)
            if not missing:
                return
            with contextlib.suppress(OSError):  # a server gone is found by the next request
                self.control.send(json.dumps({"preload": list(missing)}).encode())
                self.ahead = missing

    def _finish_ahead(self, timeout: float) -> None:
        """Take the answer to :meth:`import_ahead`'s request, waiting for it where it has
        not come yet (the caller holds the lock)."""
        if not self.ahead:
            return
        answer = self.ahead_answer or self._receive(timeout, lambda m: "preloaded" in m)
        specs, self.ahead, self.ahead_answer = self.ahead, (), None
        self._accept(specs, answer, timeout)

    def _accept(self, specs: tuple[str, ...], answer: dict | None, timeout: float) -> None:
        """Count ``specs`` as preloaded where ``answer`` says they were imported and the
        server still runs one thread; else :class:`ForkServerError`, saying why."""
        if answer is None:
            raise ForkServerError(f"it did not import {', '.join(specs)} in {timeout:g} s")
        if not answer["preloaded"]:
            raise ForkServerError(f"it could not import {', '.join(specs)}: {answer['error']}")
        if answer["threads"] != 1:
            threads = answer["threads"]
            raise ForkServerError(f"it runs {threads} threads, and forking them is unsafe")
        self.preload = (*self.preload, *(s for s in specs if s not in self.preload))

    @property
    def alive(self) -> bool:
        if self.control is None:
            return False
        if self.proc is None:  # adopted: it ends when this process closes the socket
            return self.adopted_pid is not None
        return self.proc.poll() is None

    def spawn(
        self,
        *,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        confinement: Confinement,
        pass_fds: tuple[int, int],
        timeout: float | None = None,
    ) -> ForkedWorker:
        """Fork a worker that runs ``argv`` (its ``main.py`` and arguments, where
        ``{in_fd}`` and ``{out_fd}`` name the two descriptors of ``pass_fds``). A server
        that fails to within ``timeout`` (``FORK_TIMEOUT_S``) is dropped, and
        :class:`ForkServerError` says so."""
        timeout = FORK_TIMEOUT_S if timeout is None else timeout
        read_output, write_output = os.pipe()
        try:
            with self.lock:
                self._finish_ahead(START_TIMEOUT_S)
                self.next_id += 1
                request = {
                    "id": self.next_id,
                    "argv": argv,
                    "env": env,
                    "cwd": cwd,
                    "confinement": confinement.to_json(),
                }
                assert self.control is not None
                try:
                    socket.send_fds(
                        self.control, [json.dumps(request).encode()], [write_output, *pass_fds]
                    )
                except OSError as exc:
                    raise ForkServerError(f"the server is gone: {exc}") from None
                wanted = self.next_id
                reply = self._receive(timeout, lambda m: m.get("spawned") == wanted)
                if reply is None:
                    raise ForkServerError(f"the server did not fork in {timeout:g} s")
        except ForkServerError as exc:
            os.close(read_output)
            drop(self)
            raise ForkServerError(f"the fork server stopped answering: {exc}") from None
        except BaseException:
            os.close(read_output)
            raise
        finally:
            os.close(write_output)
        return ForkedWorker(reply["pid"], os.fdopen(read_output, "rb"), self)

    def wait(self, pid: int, timeout: float | None) -> int:
        """The exit status of worker ``pid`` once it has ended."""
        with self.lock:
            if pid in self.exited:
                return self.exited.pop(pid)
            if self.control is None:  # closed by this process: see _wait_orphan
                return self._wait_orphan(pid, timeout)
            try:
                if self._receive(timeout, lambda m: m.get("exited") == pid) is None:
                    raise subprocess.TimeoutExpired(f"worker {pid}", timeout or 0)
            except ForkServerError:
                return self._wait_orphan(pid, timeout)
            return self.exited.pop(pid)

    def _wait_orphan(self, pid: int, timeout: float | None) -> int:
        """The server is gone (it died, or this process closed it): its workers are this
        process's children now (it is their subreaper)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
            except ChildProcessError:
                return -9  # reaped elsewhere: it was killed
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(pid), timeout or 0)
            time.sleep(0.01)

    def _receive(self, timeout: float | None, wanted: Any) -> dict[str, Any] | None:
        """Read messages until one that ``wanted`` accepts (exit reports are kept); None
        after ``timeout`` seconds."""
        assert self.control is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.control], [], [], left)
            if not readable:
                return None
            try:
                data = self.control.recv(MAX_MESSAGE)
            except OSError as exc:
                raise ForkServerError(f"the server is gone: {exc}") from None
            if not data:
                raise ForkServerError("the server is gone")
            message = json.loads(data)
            if "exited" in message:
                self.exited[message["exited"]] = message["code"]
            if "preloaded" in message and self.ahead:
                self.ahead_answer = message
            if wanted(message):
                return message

    def close(self) -> None:
        """Stop the server (its workers are stopped by their clients)."""
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            STARTED.discard(self.proc.pid)
            self.proc = None
        if self.errors is not None:
            self.errors.close()
            self.errors = None


def start_interpreter(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    confinement: Confinement,
    pass_fds: tuple[int, int],
) -> subprocess.Popen:
    """A worker started as a new interpreter running ``argv`` (its ``main.py`` and
    arguments), confined before it runs: the way without a fork server."""
    command = [
        sys.executable,
        "-E",  # ignore PYTHON* variables (so -u and -B are spelled out)
        "-s",
        "-u",  # unbuffered: what the worker prints is attributed to the right request
        "-B",
        *argv,
    ]
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=pass_fds,
        cwd=cwd,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: confine(confinement),
    )


_SERVERS: dict[tuple[str, ...], ForkServer] = {}
_REFUSED: dict[tuple[str, ...], str] = {}  # servers that failed to start, and why


def server_for(
    preload: tuple[str, ...], env: dict[str, str], timeout: float = START_TIMEOUT_S
) -> ForkServer | None:
    """The live server that preloads ``preload`` in the environment ``env`` (a worker's
    without a sandbox: the libraries read thread counts as they load), started if needed; None where
    there is nothing to preload or the switch is off. Raises :class:`ForkServerError`,
    saying why, where it cannot start (once tried, it is not tried again)."""
    if not preload or os.environ.get(SWITCH, "1") == "0":
        return None
    key = (*preload, *(f"{k}={v}" for k, v in sorted(env.items())))
    if key in _REFUSED:
        raise ForkServerError(_REFUSED[key])
    server = _SERVERS.get(key)
    if server is not None and server.alive:
        return server
    for known in _SERVERS.values():  # one that preloads more serves as well
        if known.alive and known.env == env and set(preload) <= set(known.preload):
            return known
    for old_key, known in list(_SERVERS.items()):  # one that preloads less learns the rest
        if known.alive and known.env == env and set(known.preload) < set(preload):
            try:
                known.extend(tuple(s for s in preload if s not in known.preload), timeout)
            except ForkServerError:
                break  # a new server below
            del _SERVERS[old_key]
            _SERVERS[key] = known
            return known
    offered = _adopt_offered(preload, env)
    if offered is not None:
        _SERVERS[key] = offered
        return offered
    close_all()
    server = ForkServer(preload, env)
    try:
        server.start(timeout)
    except (ForkServerError, subprocess.TimeoutExpired, OSError) as exc:
        server.close()
        _REFUSED[key] = f"the fork server preloading {', '.join(preload)} did not start: {exc}"
        raise ForkServerError(_REFUSED[key]) from None
    _SERVERS[key] = server
    return server


def _adopt_offered(preload: tuple[str, ...], env: dict[str, str]) -> ForkServer | None:
    """The server offered to this grading (once: the variable is consumed), where it
    preloads ``preload`` in ``env``; None, having closed it, where it does not (a batch
    started with other settings) or did not answer."""
    fd = os.environ.pop(OFFERED, "")
    if not fd.isdigit():
        return None
    try:
        server = ForkServer.adopt(int(fd))
    except (ForkServerError, OSError):
        return None
    if server.env != env or not set(preload) <= set(server.preload):
        server.close()
        return None
    return server


def drop(server: ForkServer) -> None:
    """Stop using ``server`` (it failed a request): the next worker starts a new one."""
    for key, known in list(_SERVERS.items()):
        if known is server:
            del _SERVERS[key]
    server.close()


def close_all() -> None:
    """Stop every server of this process."""
    for server in list(_SERVERS.values()):
        server.close()
    _SERVERS.clear()


atexit.register(close_all)
