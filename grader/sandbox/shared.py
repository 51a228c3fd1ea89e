"""One fork server for a whole class regrade: the libraries imported once, not once per
grading.

A grading's own fork server imports numpy, torch and transformers (three to four CPU
seconds) before its first worker starts. A batch that grades hundreds of submissions
starts one :class:`SharedForkServer` instead and, for each grading, asks it for a server
of that grading's own (:meth:`SharedForkServer.offer`): a fork of it, which has already
imported everything, talking over a new socket whose other end the grading's process
inherits (``KVGRADER_SHARED_FORKSERVER`` names the descriptor; ``forkserver.server_for``
adopts it). Each grading still has a server of its own that reaps its workers alone, so
the CPU time charged to a worker is its own grading's; the workers never hold a
descriptor of either server.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from grader.sandbox.forkserver import (
    FORK_TIMEOUT_S,
    OFFERED,
    START_TIMEOUT_S,
    SWITCH,
    ForkServer,
    ForkServerError,
)


@dataclass
class Offer:
    """A server forked for one grading: the descriptor its process inherits, its pid and
    when it started (so that a pid used again by another process is never taken for it)."""

    fd: int
    pid: int
    started: float = 0.0

    def alive(self) -> bool:
        """Whether the grading's server still runs (not another process with its pid)."""
        try:
            return psutil.Process(self.pid).create_time() == self.started
        except psutil.Error:
            return False

    def handed_over(self) -> None:
        """The grading's process holds the descriptor now: close this process's copy."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass
class SharedForkServer:
    """The batch's server: imports ``preload`` in ``env`` once, then forks per grading."""

    preload: tuple[str, ...]
    env: dict[str, str]
    python: str
    server: ForkServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start it and wait until it has imported everything; :class:`ForkServerError`
        where it cannot (the batch then grades as before, each grading importing alone)."""
        server = ForkServer(self.preload, self.env)
        try:
            server.start(timeout, python=self.python, shared=True)
        except (ForkServerError, OSError, subprocess.TimeoutExpired) as exc:
            server.close()
            raise ForkServerError(f"the shared fork server did not start: {exc}") from None
        self.server = server

    def offer(self, timeout: float = FORK_TIMEOUT_S) -> Offer | None:
        """A new server for one grading, or None where the shared one has stopped
        answering (that grading then starts its own)."""
        if self.server is None or not self.server.alive:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                assert self.server.control is not None
                socket.send_fds(
                    self.server.control, [json.dumps({"serve": True}).encode()], [theirs.fileno()]
                )
                reply = self.server._receive(timeout, lambda m: "forked" in m)
        except (OSError, ForkServerError):
            reply = None
        finally:
            theirs.close()
        try:
            pid = int(reply["forked"]) if reply else 0
            started = psutil.Process(pid).create_time() if pid else 0.0
        except psutil.Error:
            pid = 0
        if not pid:
            ours.close()
            return None
        return Offer(ours.detach(), pid, started)

    def close(self) -> None:
        """Stop it (the servers it forked end with their gradings)."""
        if self.server is not None:
            self.server.close()
            self.server = None


@contextlib.contextmanager
def handing(offer: Offer | None, env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """``subprocess.Popen``'s ``env`` and ``pass_fds`` for the one grading process that
    takes ``offer`` (without one: ``env`` alone). This process's copy of the descriptor
    is closed afterwards, whether that process started or not."""
    try:
        if offer is None:
            yield {"env": env, "pass_fds": ()}
        else:
            yield {"env": {**env, OFFERED: str(offer.fd)}, "pass_fds": (offer.fd,)}
    finally:
        if offer is not None:
            offer.handed_over()


def start_shared(
    preload: tuple[str, ...], env: dict[str, str], python: str
) -> tuple[SharedForkServer | None, str]:
    """The batch's shared server, or None and why it could not start."""
    if not preload or os.environ.get(SWITCH, "1") == "0":
        return None, ""
    shared = SharedForkServer(preload, env, python)
    try:
        shared.start()
    except (ForkServerError, OSError) as exc:
        shared.close()
        return None, f"{exc}"
    return shared, ""
