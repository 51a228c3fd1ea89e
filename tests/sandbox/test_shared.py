"""A batch's shared fork server: each grading adopts a server forked for it alone, whose
workers are what ``subprocess`` would start, hold no descriptor of either server, and
are reaped (with their orphans) by their own grading's server; an offer made in another
environment is refused, and the grading starts its own server."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from grader.core.registry import PARTS
from grader.sandbox import forkserver
from grader.sandbox.forkserver import ForkServer, server_for
from grader.sandbox.sandbox import Sandbox
from grader.sandbox.shared import Offer, SharedForkServer, start_shared
from tests.sandbox.test_forkserver import run_probe, spawn_exit

#: Every test here starts, drops or counts fork servers: with a registry of its own, the
#: server this test worker's gradings share survives it (see ``own_fork_servers``).
pytestmark = pytest.mark.usefixtures("own_fork_servers")

#: Leaves an orphan that burns about 0.4 s of CPU and exits, then exits at once itself.
ORPHAN = """import os, sys, time
if os.fork() == 0:
    if os.fork() == 0:
        end = time.process_time() + 0.4
        while time.process_time() < end:
            pass
    os._exit(0)
os.wait()
time.sleep(1.0)
sys.exit(0)
"""


def environment(box: Sandbox) -> dict[str, str]:
    return {**box.environment("cpu", 1), "HOME": "/nonexistent"}


@pytest.fixture
def shared(box: Sandbox) -> Iterator[SharedForkServer]:
    running, why = start_shared(("json",), environment(box), sys.executable)
    assert running is not None, why
    yield running
    running.close()


def adopt(
    offer: Offer,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    preload: tuple[str, ...] = ("json",),
) -> ForkServer:
    """What a grading's process does with its offer: ``server_for`` finds it named (and
    adopts it, or starts a server of its own)."""
    fd = os.dup(offer.fd)  # this process plays the grading: its copy stays open
    offer.handed_over()
    monkeypatch.setenv(forkserver.OFFERED, str(fd))
    server = server_for(preload, env, timeout=60)
    assert server is not None and forkserver.OFFERED not in os.environ  # consumed once
    return server


def test_a_grading_adopts_its_own_server_and_its_workers_are_started_ones(
    box, shared, monkeypatch
) -> None:
    offer = shared.offer()
    assert offer is not None
    server = adopt(offer, monkeypatch, environment(box))
    assert server.proc is None and server.pid == offer.pid  # not started by this process
    assert psutil.Process(offer.pid).ppid() == shared.server.pid  # forked by the batch's
    assert server.preload == ("json",) and server.env == environment(box)
    forked, forked_output = run_probe(box, server)
    started, started_output = run_probe(box, None)
    assert forked == started and forked_output == started_output
    assert forked["other_fds"] == []  # nothing of either server reaches the worker


def test_each_grading_has_a_server_that_reaps_its_own_workers_and_their_orphans(
    box, shared, monkeypatch
) -> None:
    """The CPU time of an orphan a worker left is charged to that grading's server, which
    is the orphans' reaper, and to no other grading's."""
    first, second = shared.offer(), shared.offer()
    assert first is not None and second is not None and first.pid != second.pid
    other = psutil.Process(second.pid)
    server = adopt(first, monkeypatch, environment(box))
    (box.worker_dir / "exit.py").write_text(ORPHAN)
    worker = spawn_exit(box, server, "-")
    assert psutil.Process(worker.pid).ppid() == first.pid
    assert worker.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reaped = psutil.Process(first.pid).cpu_times()
        if reaped.children_user + reaped.children_system >= 0.3:
            break
        time.sleep(0.05)
    assert reaped.children_user + reaped.children_system >= 0.3
    theirs = other.cpu_times()
    assert theirs.children_user + theirs.children_system < 0.1
    assert list(server.exited) == []  # the worker's exit was read; no orphan's is reported
    second.handed_over()


def test_an_offer_in_another_environment_is_refused_and_a_server_is_started(
    box, shared, monkeypatch
) -> None:
    offer = shared.offer()
    assert offer is not None
    elsewhere = {**environment(box), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2"}
    server = adopt(offer, monkeypatch, elsewhere)
    assert server.proc is not None and server.adopted_pid is None
    deadline = time.monotonic() + 10
    while psutil.pid_exists(offer.pid):  # told to stop (its socket closed), it ended
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_gradings_server_ends_with_it_and_the_batchs_when_closed(box) -> None:
    """A grading's server ends when the grading closes its socket, and the batch's server
    reaps it at once (its pid is free again, its CPU time added to the batch's); the
    batch's server ends when closed, and then makes no offer."""
    running, why = start_shared(("json",), environment(box), sys.executable)
    assert running is not None, why
    proc = running.server.proc
    offer = running.offer()
    assert offer is not None and offer.alive()
    offer.handed_over()  # the grading ended: its server ends with it
    deadline = time.monotonic() + 10
    while psutil.pid_exists(offer.pid):  # not a zombie waiting for the next grading
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not offer.alive()  # a batch's timeout never kills what takes its pid next
    assert proc.poll() is None
    running.close()
    assert proc.poll() is not None and running.offer() is None


def test_no_shared_server_where_fork_servers_are_switched_off(box, monkeypatch) -> None:
    monkeypatch.setenv(forkserver.SWITCH, "0")
    assert start_shared(("json",), environment(box), sys.executable) == (None, "")
    monkeypatch.setenv(forkserver.SWITCH, "1")
    running, why = start_shared(("no_such_module_anywhere",), environment(box), sys.executable)
    assert running is None and "did not start" in why


def test_a_server_whose_imports_add_to_its_environment_is_adopted(box, monkeypatch) -> None:
    """Importing Part 4's transformers sets a variable of torch's own (its compiler's cache
    folder); what a server serves is the environment it was started in, the one a grading
    asks for."""
    part4 = PARTS["part4"].preload
    running, why = start_shared(part4, environment(box), sys.executable)
    assert running is not None, why
    try:
        offer = running.offer()
        assert offer is not None
        assert adopt(offer, monkeypatch, environment(box), part4).adopted_pid == offer.pid
    finally:
        running.close()


def test_a_shared_server_that_died_makes_no_offer(box) -> None:
    """The batch's server killed mid-batch: each grading then starts its own server."""
    running, why = start_shared(("json",), environment(box), sys.executable)
    assert running is not None, why
    running.server.proc.kill()
    running.server.proc.wait()
    assert running.offer() is None
    running.close()
