"""A request that timed out is told apart: starved by a busy machine (the worker was ready
to run and got little CPU) or hung by itself (it spun, or slept, or waited on a lock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from grader.runtime import starvation
from grader.runtime.starvation import (
    Reading,
    figures,
    read,
    starved,
    taken,
    timeout_message,
    was_starved,
)
from grader.sandbox import cgroups, cpu_share
from grader.sandbox.confine import join_group

HUNG = "(an infinite loop, or far too slow)"


@pytest.mark.parametrize(
    ("cpu", "waiting", "queued", "why"),
    [
        (0.0, 0.0, 0.0, "asleep or deadlocked: it asked for no CPU"),
        (19.8, 0.1, 0.1, "a busy loop alone on the machine"),
        (20.0, 20.0, 1900.0, "a hundred busy loops of its own, on its share"),
        (8.0, 20.0, 1980.0, "a hundred loops of its own on a loaded machine: its own crowd"),
        (2.0, 2.5, 2.5, "mostly asleep, a little waiting"),
        (9.2, 10.2, 10.2, "an endless loop given half a core by a busy machine"),
        (None, 19.0, 19.0, "no CPU figure"),
        (0.5, None, None, "no waiting figure"),
    ],
)
def test_a_request_that_had_the_cpu_or_asked_for_none_hung(cpu, waiting, queued, why) -> None:
    assert not starved(20.0, cpu, waiting, queued), why


@pytest.mark.parametrize(
    ("cpu", "waiting", "queued"),
    [(0.2, 19.7, 19.7), (3.0, 16.0, 16.0), (4.0, 14.0, 30.0), (0.4, 19.0, None)],
)
def test_a_request_ready_to_run_that_got_little_cpu_was_starved(cpu, waiting, queued) -> None:
    assert starved(20.0, cpu, waiting, queued)


def test_the_message_blames_the_code_only_when_it_hung() -> None:
    taken()
    start = Reading(100.0, 1.0, 1.0, 1.0)
    hung = timeout_message("generate(x)", 20, start, Reading(120.0, 1.0, 1.1, 1.1))
    assert HUNG in hung and taken() == []
    busy = timeout_message("generate(x)", 20, start, Reading(120.0, 1.3, 19.0, 19.0))
    assert HUNG not in busy and "machine was busy" in busy and "regrade" in busy
    assert taken() == [{"request": "generate(x)", "wall_s": 20.0, "cpu_s": 0.3,
                        "waiting_s": 18.0}]  # fmt: skip
    assert taken() == []  # kept by one check only


# --------------------------------------------- real processes on a starved machine

BUSY = "while True:\n    pass\n"
SLEEP = "import time\nwhile True:\n    time.sleep(60)\n"
LOCKED = "import threading\nlock = threading.Lock()\nlock.acquire()\nlock.acquire()\n"


def starved_slot() -> cpu_share.GradingGroup:
    """A group that gets almost no CPU while anything else wants it (the least weight)."""
    slot = cpu_share.create("starved")
    cpu = next((g for g in slot.groups if "cpu" in g.controllers), None)
    if cpu is None:
        slot.remove()
        pytest.skip("no writable cpu controller here")
    name = "cpu.weight" if cpu.version == 2 else "cpu.shares"
    (cpu.path / name).write_text("1" if cpu.version == 2 else "2")
    return slot


def hogs(count: int) -> tuple[cpu_share.GradingGroup, list[subprocess.Popen]]:
    """``count`` busy loops in a group of their own, at the ordinary weight."""
    crowd = cpu_share.create("hogs")
    return crowd, [
        subprocess.Popen(crowd.command([sys.executable, "-c", BUSY])) for _ in range(count)
    ]


def worker(code: str, clock: cgroups.CpuGroup | None) -> int:
    """A process running ``code`` (in its own CPU clock ``clock``), not yet starved."""
    pid = os.fork()
    if pid == 0:
        if clock is None or join_group(clock.procs_file):
            exec(compile(code, "worker", "exec"), {})
        os._exit(1)
    return pid


@pytest.fixture(params=["cgroup", "process tree"])
def clock(request):
    """The worker's CPU clock: a cgroup of its own, or none (its threads' figures)."""
    if request.param == "process tree":
        yield None
        return
    made = cgroups.create("starvation")
    if made is None:
        pytest.skip("no writable cgroup hierarchy here")
    yield made
    made.remove()


@pytest.mark.parametrize(
    ("code", "expected"), [(BUSY, True), (SLEEP, False), (LOCKED, False)],
    ids=["ready to run", "asleep", "deadlocked"],
)  # fmt: skip
def test_a_worker_crowded_out_is_starved_and_one_that_waits_on_itself_is_not(
    code: str, expected: bool, clock: cgroups.CpuGroup | None
) -> None:
    """Busy loops on every core at the ordinary weight, the worker moved (once it is
    spinning, asleep or deadlocked) to a group at the least weight: a worker that wants
    the CPU gets almost none and is starved; one that waits on itself asks for none and
    hung, beside the same loops."""
    slot = starved_slot()
    crowd, loops = hogs(2 * (os.cpu_count() or 1))
    pid = worker(code, clock)
    try:
        time.sleep(0.5)  # started, and doing what it does
        assert slot.join(pid)
        before = read(clock, pid)
        time.sleep(2.0)
        after = read(clock, pid, final=True)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        crowd.remove()
        slot.remove()
        for loop in loops:
            loop.wait(timeout=30)
    assert was_starved(before, after) is expected, figures(before, after)


def test_a_worker_with_processes_of_its_own_and_no_group_is_never_called_starved() -> None:
    """Without a cgroup its children's runs are not in its figures: no claim is made."""
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                             "subprocess.Popen(['sleep', '30'])\ntime.sleep(30)\n"])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read(None, proc.pid).waiting_s is not None
        assert read(None, proc.pid, final=True).waiting_s is None
    finally:
        for child in psutil.Process(proc.pid).children():
            child.kill()
        proc.kill()
        proc.wait()


def test_a_crowd_born_during_the_request_is_counted_whole() -> None:
    """The request's first reading may come before the worker joined its group: an empty
    group reads as no time, so the 128 loops it starts afterwards still count as its own
    crowd (their waits sum to far more than the wall time), and it is never starved."""
    group = cgroups.create("crowd")
    if group is None:
        pytest.skip("no writable cgroup hierarchy here")
    before = read(group, None)
    assert (before.cpu_s, before.queued_s) == (0.0, 0.0)
    pid = worker("import os\nfor _ in range(7):\n    os.fork()\n" + BUSY, group)
    try:
        time.sleep(2.0)
        after = read(group, pid, final=True)
    finally:
        group.remove()
        os.waitpid(pid, 0)
    assert after.queued_s is not None
    assert after.queued_s - before.queued_s > starvation.CROWD * (after.at - before.at)
    assert not was_starved(before, after)


def test_a_request_the_machine_starved_is_not_blamed_on_the_code_when_asked_again() -> None:
    """After a starved timeout, the checks that would run the same request again say the
    machine was busy and ask for a regrade; after a timeout of the code's own, they say
    it ran past the time limit."""
    import threading
    import types

    from grader.runtime.client import WorkerClient
    from grader.runtime.outcomes import SubmissionError
    from grader.sandbox.sandbox import Limits

    sandbox = types.SimpleNamespace(expired=threading.Event())
    client = WorkerClient("part2", "transformer_skeleton.py", "/nonexistent", sandbox, Limits())
    client._timed_out |= {"generate", "forward"}
    client._starved.add("generate")
    with pytest.raises(SubmissionError) as busy:
        client._refuse_if_stopped("generate(...)", "generate")
    assert "the machine was busy, not because of your code" in busy.value.message
    with pytest.raises(SubmissionError) as own:
        client._refuse_if_stopped("forward(...)", "forward")
    assert "already ran past the time limit" in own.value.message
    client._refuse_if_stopped("sample(...)", "sample")  # never timed out: runs
