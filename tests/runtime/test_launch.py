"""A grading starts its workers (``grader/runtime/launch.py``) from a fork server, and
grades exactly as it does with workers started as new interpreters
(``KVGRADER_FORKSERVER=0``); a server that fails is dropped and named."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader.core.registry import PARTS
from grader.runtime import launch
from grader.sandbox import forkserver
from grader.sandbox.forkserver import ForkServer
from tests.conftest import FAST_LIMITS, SOLUTION, in_param_count, patched_solution, run_grade

#: Every test here starts, drops or counts fork servers: with a registry of its own, the
#: server this test worker's gradings share survives it (see ``own_fork_servers``).
pytestmark = pytest.mark.usefixtures("own_fork_servers")


def servers_started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """What each fork server started from now on preloads, in the order they start."""
    started: list[tuple[str, ...]] = []
    start = ForkServer.start

    def counting(self: ForkServer, *args, **kwargs):
        started.append(self.preload)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(ForkServer, "start", counting)
    return started


def test_a_grading_forks_its_workers_and_grades_as_started_workers_do(
    tmp_path: Path, monkeypatch
) -> None:
    spawned = []
    spawn = ForkServer.spawn

    def counted(self, **kwargs):
        spawned.append(kwargs["argv"])
        return spawn(self, **kwargs)

    monkeypatch.setattr(ForkServer, "spawn", counted)
    forked = run_grade(SOLUTION, tmp_path / "forked", parts=["part1"])
    assert spawned and all(argv[0].endswith("main.py") for argv in spawned)
    (server,) = forkserver._SERVERS.values()
    assert server.preload == PARTS["part1"].preload  # no part follows: nothing imported ahead
    monkeypatch.setenv(forkserver.SWITCH, "0")
    forkserver.close_all()
    before = len(spawned)
    started = run_grade(SOLUTION, tmp_path / "started", parts=["part1"])
    assert len(spawned) == before
    assert forked.results.score == started.results.score == started.results.max_score
    # and each results file says how its workers started, for the staff
    assert list(forked.data["extra_data"]["worker_starts"]) == ["fork server"]
    assert list(started.data["extra_data"]["worker_starts"]) == ["new interpreter"]

    def shown(graded):
        return [(t.get("number"), t["score"], t.get("output")) for t in graded.data["tests"]]

    assert shown(forked) == shown(started)


def test_without_its_fork_server_a_grading_starts_workers_and_tells_the_staff(
    tmp_path: Path, monkeypatch
) -> None:
    broken = dataclasses.replace(PARTS["part1"], preload=("no_such_module_anywhere",))
    monkeypatch.setitem(PARTS, "part1", broken)
    graded = run_grade(SOLUTION, tmp_path / "out", parts=["part1"])
    assert graded.results.score == graded.results.max_score
    (warning,) = [w for w in graded.data["extra_data"]["sandbox_warnings"] if "fork" in w]
    assert "no_such_module_anywhere did not start: it exited with status 1" in warning


def test_a_server_that_stops_answering_is_dropped_and_the_staff_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that hangs (stopped here with SIGSTOP) does not fork within its time:
    the grading starts its workers the old way, says why, and drops the server."""
    monkeypatch.setattr(forkserver, "FORK_TIMEOUT_S", 2.0)  # its time, shortened here
    run_grade(SOLUTION, tmp_path / "first", parts=["part1"])  # its server starts, and stays
    (server,) = forkserver._SERVERS.values()
    os.kill(server.proc.pid, signal.SIGSTOP)
    graded = run_grade(SOLUTION, tmp_path / "out", parts=["part1"])
    assert graded.results.score == graded.results.max_score  # started the old way
    (warning,) = [w for w in graded.data["extra_data"]["sandbox_warnings"] if "fork" in w]
    assert warning == "the fork server stopped answering: the server did not fork in 2 s"
    assert not forkserver._SERVERS and server.proc is None  # dropped, and stopped


@pytest.mark.parametrize("forked", ["1", "0"])
def test_a_workers_gpu_selection_is_the_graders(tmp_path: Path, monkeypatch, forked: str) -> None:
    # Through a whole grading, with the worker forked from the fork server or started anew.
    monkeypatch.setenv(forkserver.SWITCH, forked)
    code = "    assert __import__('os').environ.get('CUDA_VISIBLE_DEVICES') == '3', 'not passed'"
    submission = patched_solution(tmp_path / "sub", "question1.py", [in_param_count(code)])
    for visible, passes in (("3", True), ("5", False)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        graded = run_grade(
            submission,
            tmp_path / visible,
            parts=["part1"],
            limits=FAST_LIMITS,
            numbers=frozenset({"1.1"}),
        )
        assert (graded.score("1.1") > 0) is passes, graded.output("1.1")
    assert "not passed" in graded.output("1.1")


def test_one_fork_server_serves_the_whole_grading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each part's libraries hold the part's before it: a grading of all four parts starts
    one server, which imports torch for Part 2 and transformers for Part 4 (an
    interpreter's imports cost seconds of CPU, a fork almost nothing). Torch is imported
    while Part 1's worker runs, asked for as that worker is forked: Part 2's first worker
    finds it imported."""
    started = servers_started(monkeypatch)
    ahead: list[tuple[str, ...]] = []
    import_ahead = ForkServer.import_ahead

    def asked(self: ForkServer, specs: tuple[str, ...]) -> None:
        ahead.append(specs)
        import_ahead(self, specs)

    monkeypatch.setattr(ForkServer, "import_ahead", asked)
    numbers = frozenset({"1.1", "2.2", "3.2", "4.3"})
    graded = run_grade(SOLUTION, tmp_path, limits=FAST_LIMITS, numbers=numbers)
    for number in numbers:
        assert graded.score(number) == graded.test(number)["max_score"], number
    assert not [w for w in graded.results.extra_data["sandbox_warnings"] if "fork" in w]
    order = [PARTS[p].preload for p in ("part1", "part2", "part3", "part4")]
    assert all(set(a) <= set(b) for a, b in itertools.pairwise(order))
    assert started == [PARTS["part1"].preload]
    assert ahead == [PARTS["part2"].preload]  # once, by Part 1's worker alone


def test_a_part1_worker_that_dies_at_import_leaves_the_next_part_its_libraries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Torch is imported beside Part 1's worker whatever that worker does: one that exits
    while its file loads leaves Part 2 graded in full, forked from the same server."""
    started = servers_started(monkeypatch)
    submission = patched_solution(tmp_path / "sub", "question1.py", [])
    with open(submission / "question1.py", "a") as f:
        f.write("\nimport os\n\nos._exit(3)\n")
    numbers = frozenset({"1.1", "2.2"})
    graded = run_grade(
        submission, tmp_path / "out", parts=["part1", "part2"], limits=FAST_LIMITS, numbers=numbers
    )
    assert graded.score("1.1") == 0 and "exit" in graded.output("1.1").lower()
    assert graded.score("2.2") == graded.test("2.2")["max_score"], graded.output("2.2")
    assert started == [PARTS["part1"].preload]
    assert not [w for w in graded.results.extra_data["sandbox_warnings"] if "fork" in w]


def test_a_live_server_that_preloads_more_serves_a_part_that_needs_less() -> None:
    from grader.sandbox.sandbox import worker_environment

    env = worker_environment(None, "cpu", 1)
    wide = forkserver.server_for(("json", "numpy"), env)
    assert wide is not None and wide.alive
    assert forkserver.server_for(("numpy",), env) is wide
    narrow = forkserver.server_for(("csv",), env)  # not preloaded there: a new one
    assert narrow is not wide and not wide.alive


def test_gpu_workers_are_forked_only_where_the_switch_says(monkeypatch) -> None:
    """On a GPU the workers are started as new interpreters unless
    ``KVGRADER_FORK_ON_GPU=1``; then they are asked of a fork server whose environment
    makes torch ask NVML, not the driver, whether there is a GPU."""
    asked: list[tuple[tuple[str, ...], dict[str, str]]] = []

    def server_for(preload: tuple[str, ...], env: dict[str, str]) -> None:
        asked.append((preload, env))

    monkeypatch.setattr(launch, "server_for", server_for)
    job = SimpleNamespace(part="part2", device="cuda", threads=1)
    monkeypatch.delenv(launch.FORK_ON_GPU, raising=False)
    assert launch._forked(job, None, {}, (0, 1)) is None and asked == []  # type: ignore[arg-type]
    monkeypatch.setenv(launch.FORK_ON_GPU, "1")
    assert launch._forked(job, None, {}, (0, 1)) is None  # type: ignore[arg-type]
    [(preload, env)] = asked
    assert preload == PARTS["part2"].preload
    assert env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1" and env["KVGRADER_DEVICE"] == "cuda"
    cpu = SimpleNamespace(part="part2", device="cpu", threads=1)
    launch._forked(cpu, None, {}, (0, 1))  # type: ignore[arg-type]
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in asked[-1][1]
