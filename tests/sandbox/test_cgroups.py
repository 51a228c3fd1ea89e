"""A worker's cgroup counts the CPU time of every process in it, whoever reaps it, and
removing it leaves nothing running; a grading's groups give it the same CPU weight as the
gradings beside it and a process limit, from the grader's first instruction."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.sandbox import cgroups, cpu_share
from grader.sandbox.confine import join_group


@pytest.fixture
def group():
    made = cgroups.create("test")
    if made is None:
        pytest.skip("no writable cgroup hierarchy here (not root, or read-only)")
    yield made
    made.remove()


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_time_of_a_grandchild_reaped_elsewhere_is_counted(group: cgroups.CpuGroup) -> None:
    assert group.usage_s() == pytest.approx(0.0, abs=0.01)
    pid = os.fork()
    if pid == 0:  # joins, then leaves its work to an orphan grandchild
        os._exit(0 if join_group(group.procs_file) and (os.fork() or burn(0.3)) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    deadline = time.monotonic() + 10
    while group.pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group.pids()
    assert (group.usage_s() or 0.0) >= 0.25


def test_remove_kills_what_is_left_and_deletes_the_group(group: cgroups.CpuGroup) -> None:
    pid = os.fork()
    if pid == 0:
        join_group(group.procs_file)
        time.sleep(60)
        os._exit(0)
    deadline = time.monotonic() + 5
    while pid not in group.pids() and time.monotonic() < deadline:
        time.sleep(0.01)
    group.remove()
    assert os.waitpid(pid, 0)[1] != 0  # killed, not finished
    assert not group.path.exists()


def test_switched_off_or_without_root_there_is_no_group(monkeypatch) -> None:
    monkeypatch.setenv(cgroups.CGROUPS_ENV, "0")
    assert cgroups.create("off") is None


def test_the_hierarchies_are_read_from_the_mount_table() -> None:
    for parent, version in cgroups.parents():
        assert version in (1, 2) and parent.is_absolute()


# ------------------------------------------------------------ a share per grading


@pytest.fixture
def grading():
    """A grading's groups, where this machine lets them be written."""
    made = cpu_share.create("test")
    if not made.groups:
        pytest.skip("no writable cpu or pids controller here (not root, or read-only)")
    yield made
    made.remove()


def groups_of(pid: int) -> set[str]:
    """The names of the cgroup folders process ``pid`` is in, in every hierarchy."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    return {line.split(":", 2)[2].rsplit("/", 1)[-1] for line in lines}


def test_a_grading_gets_the_same_weight_and_a_process_limit(grading) -> None:
    """Each controller's group carries the weight every grading gets alike, and the pids
    limit; the mode the results record names them."""
    cpu = next(g for g in grading.groups if "cpu" in g.controllers)
    name, value = cpu_share.WEIGHT[cpu.version]
    assert (cpu.path / name).read_text().strip() == value
    assert f"{name} {value}" in grading.mode
    pids = [g for g in grading.groups if "pids" in g.controllers]
    if pids:
        assert (pids[0].path / "pids.max").read_text().strip() == str(cpu_share.GRADING_PIDS)
        assert "pids.max" in grading.mode


def test_the_grader_starts_inside_its_groups_and_removing_them_kills_what_is_left(
    grading,
) -> None:
    """The wrapped command is in every group from its first instruction (the shell joins,
    then becomes it, same pid); what it leaves running dies with the groups."""
    script = "import os, sys, time; print(os.getpid(), flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        grading.command([sys.executable, "-c", script]), stdout=subprocess.PIPE, text=True
    )
    assert int(proc.stdout.readline()) == proc.pid
    assert groups_of(proc.pid) >= {g.path.name for g in grading.groups}
    grading.remove()
    assert proc.wait(timeout=10) != 0
    assert not any(g.path.exists() for g in grading.groups)


def test_a_process_moved_in_brings_what_it_forks_afterwards(grading) -> None:
    """A fork server offered to the grading is moved before anything is forked from it."""
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    try:
        assert grading.join(pid)
        assert groups_of(pid) >= {g.path.name for g in grading.groups}
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_the_pids_limit_stops_a_fork_bomb_of_the_grading(monkeypatch) -> None:
    monkeypatch.setenv(cpu_share.PIDS_ENV, "64")
    grading = cpu_share.create("bomb")
    if not any("pids" in g.controllers for g in grading.groups):
        grading.remove()
        pytest.skip("no writable pids controller here")
    script = (
        "import os, sys\nn = 0\nwhile n < 500:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        os.read(0, 1)\n"
        "        os._exit(0)\n    n += 1\nprint(n, flush=True)\n"
    )
    try:
        proc = subprocess.run(
            grading.command([sys.executable, "-c", script]),
            input="x" * 600, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert 0 < int(proc.stdout) < 64
    finally:
        grading.remove()


def test_a_quota_caps_the_grading_at_its_cores(monkeypatch) -> None:
    monkeypatch.setenv(cpu_share.CPUS_ENV, "1.5")
    grading = cpu_share.create("quota")
    try:
        cpu = next((g for g in grading.groups if "cpu" in g.controllers), None)
        if cpu is None:
            pytest.skip("no writable cpu controller here")
        if cpu.version == 2:
            assert (cpu.path / "cpu.max").read_text().split() == ["150000", "100000"]
        else:
            assert (cpu.path / "cpu.cfs_quota_us").read_text().strip() == "150000"
        assert "1.5 cores" in grading.mode
    finally:
        grading.remove()


def busy_loops(grading: cpu_share.GradingGroup, count: int) -> subprocess.Popen:
    """``count`` busy loops inside ``grading``, until their stdin closes."""
    script = (
        "import os, sys, threading\n"
        f"for _ in range({count - 1}):\n"
        "    if os.fork() == 0:\n        break\n"
        "threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()\n"
        "while True:\n    pass\n"
    )
    return subprocess.Popen(grading.command([sys.executable, "-c", script]), stdin=subprocess.PIPE)


def cpu_of(grading: cpu_share.GradingGroup) -> float:
    """CPU seconds of the live processes in ``grading``'s cpu group."""
    cpu = next(g for g in grading.groups if "cpu" in g.controllers)
    total = 0.0
    for pid in (cpu.path / "cgroup.procs").read_text().split():
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    return total


def test_a_hundred_loops_take_no_more_than_one_loop_beside_them(grading) -> None:
    """Two gradings side by side: one with a hundred busy loops, one with a single loop.
    Each gets an equal part of the CPU, so the lone loop runs about as much as all hundred
    together (without the groups it would get a hundredth of it)."""
    if not any("cpu" in g.controllers for g in grading.groups):
        pytest.skip("no writable cpu controller here")
    crowd = cpu_share.create("crowd")
    many, one = busy_loops(crowd, 100), busy_loops(grading, 1)
    try:
        time.sleep(3)
        many_s, one_s = cpu_of(crowd), cpu_of(grading)
    finally:
        for proc in (many, one):
            proc.stdin.close()
            proc.wait(timeout=30)
        crowd.remove()
    assert one_s > 0.3 * many_s, (one_s, many_s)


def test_switched_off_a_grading_has_no_group_and_says_so(monkeypatch) -> None:
    monkeypatch.setenv(cpu_share.SWITCH, "0")
    grading = cpu_share.create("off")
    assert grading.groups == [] and grading.mode == cpu_share.NO_GROUP
    assert grading.command(["true"]) == ["true"] and grading.join(os.getpid())
    monkeypatch.delenv(cpu_share.MODE_ENV, raising=False)
    assert cpu_share.recorded_mode() == cpu_share.ALONE
    monkeypatch.setenv(cpu_share.MODE_ENV, grading.mode)
    assert cpu_share.recorded_mode() == cpu_share.NO_GROUP


def fake_hierarchy(root: Path, monkeypatch, *, delegates: bool) -> Path:
    """A v2 hierarchy at ``root/v2`` offering cpu and pids (that takes them below it only
    where it ``delegates``) beside v1 ``cpu`` and ``pids`` ones, this process at their tops."""
    v2 = root / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu io memory pids\n")
    if delegates:
        (v2 / "cgroup.subtree_control").write_text("")
    else:
        (v2 / "cgroup.subtree_control").mkdir()  # a group with processes: writes refused
    for name in ("cpu", "pids"):
        (root / name).mkdir()
    table = [(str(v2), "cgroup2", "rw"), (str(root / "cpu"), "cgroup", "rw,cpu"),
             (str(root / "pids"), "cgroup", "rw,pids")]  # fmt: skip
    monkeypatch.setattr(cpu_share, "mount_table", lambda: table)
    monkeypatch.setattr(cpu_share, "own_path", lambda controller: "/")
    return v2


def test_cgroup_v2_gives_one_group_its_weight_quota_and_process_limit(
    tmp_path: Path, monkeypatch
) -> None:
    v2 = fake_hierarchy(tmp_path, monkeypatch, delegates=True)
    monkeypatch.setenv(cpu_share.CPUS_ENV, "2")
    grading = cpu_share.create("v2")
    assert [(g.version, g.controllers) for g in grading.groups] == [(2, ("cpu", "pids"))]
    group = grading.groups[0].path
    assert group.parent == v2 and (v2 / "cgroup.subtree_control").read_text()  # delegated
    assert (group / "cpu.weight").read_text() == "100"
    assert (group / "cpu.max").read_text() == "200000 100000"
    assert (group / "pids.max").read_text() == str(cpu_share.GRADING_PIDS)
    assert grading.mode.startswith("cgroup v2 cpu.weight 100, cpu.max (2 cores), pids.max")


def test_a_v2_group_that_cannot_delegate_falls_back_to_v1(tmp_path: Path, monkeypatch) -> None:
    fake_hierarchy(tmp_path, monkeypatch, delegates=False)
    grading = cpu_share.create("v1")
    assert [(g.version, g.controllers) for g in grading.groups] == [(1, ("cpu",)), (1, ("pids",))]
    assert (grading.groups[0].path / "cpu.shares").read_text() == "1024"
    assert grading.groups[0].path.parent == tmp_path / "cpu"
    assert not any(p.name.startswith("kvgrading") for p in (tmp_path / "v2").iterdir())


def test_groups_left_by_a_grader_that_is_gone_are_swept_and_no_other(tmp_path: Path) -> None:
    """A grader killed before it removed its groups leaves them empty: the next one to
    make a group deletes them; a live maker's, a busy one and another program's stay."""
    gone, alive = "kvgrading-999999999-0-a", f"kvgrading-{os.getpid()}-0-b"
    (tmp_path / gone / "kvgrader-999999999-0-part1").mkdir(parents=True)
    (tmp_path / alive).mkdir()
    (tmp_path / "kvgrading-999999998-0-busy").mkdir()
    (tmp_path / "kvgrading-999999998-0-busy" / "cgroup.procs").write_text("1")  # rmdir refused
    (tmp_path / "other-999999999").mkdir()
    cgroups.sweep(tmp_path, "kvgrading")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [alive, "kvgrading-999999998-0-busy", "other-999999999"]
    )
