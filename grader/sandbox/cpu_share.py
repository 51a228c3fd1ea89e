"""A CPU share and a process limit per grading, so that gradings side by side cannot take
each other's CPU.

A class regrade grades several submissions at once on one machine
(:mod:`grader.ta.regrade.batch`). Without a group of their own, a submission that starts a
hundred busy loops gets a hundred times the CPU of the worker graded beside it, whose timed
checks then run out of time. Each grading's processes (the grader, its fork servers, the
submission's workers and the trusted reference's) are put in one cgroup per controller:

- ``cpu``: the same weight for every grading (v2 ``cpu.weight``, v1 ``cpu.shares``), so
  that under contention each grading gets an equal part of the machine however many
  processes it runs; with ``KVGRADER_GRADING_CPUS`` also a quota of that many cores (v2
  ``cpu.max``, v1 ``cpu.cfs_quota_us``), so that a grading never takes more even from an
  idle machine.
- ``pids``: at most ``KVGRADER_GRADING_PIDS`` processes and threads in the grading
  (``pids.max``), beside the worker account's ``RLIMIT_NPROC``, which does not count what
  runs as the grader.

The grader joins its groups before it starts (:meth:`GradingGroup.command`), and every
process it starts is born in them; the fork server a batch offers to a grading is moved
there before the grading gets it. The groups' files belong to root: a worker cannot leave.
The worker's own CPU clock (:mod:`grader.sandbox.cgroups`) is made under the grader's v2
group, so it stays inside the grading's share.

Each controller is taken from cgroup v2 where this process's group can hand it to groups
below it, else from its v1 hierarchy. Where neither can be written (not root, a read-only
``/sys/fs/cgroup``, a v2 group that holds processes and has not delegated ``cpu``) there
is no group, the gradings share the machine as before, and the results say so
(``extra_data.cpu_isolation``, from :data:`MODE_ENV`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

from grader.sandbox.cgroups import CpuGroup, mount_table, own_path, sweep

#: Set to "0" to grade side by side without a group per grading (a TA's diagnosis).
SWITCH = "KVGRADER_CPU_SHARE"
#: Cores each grading may use at most (a quota; unset: a share alone, no quota).
CPUS_ENV = "KVGRADER_GRADING_CPUS"
#: Processes and threads each grading may have at once (``pids.max``).
PIDS_ENV = "KVGRADER_GRADING_PIDS"
#: What the batch tells its grader about the grading's group, for the results.
MODE_ENV = "KVGRADER_CPU_ISOLATION"
#: A grading's process limit: far above what one needs (the grader's and libraries'
#: threads, a few fork servers and workers), far below what would exhaust the machine.
GRADING_PIDS = 2048
#: The quota's accounting period (the kernel's default).
PERIOD_US = 100_000
#: Every grading's weight: the default, the same for all (v2 ``cpu.weight``, v1 ``cpu.shares``).
WEIGHT = {2: ("cpu.weight", "100"), 1: ("cpu.shares", "1024")}
#: What the results say where a grading had no group: in a batch, and graded alone.
NO_GROUP = "none: gradings side by side share the CPU (no cgroup could be written)"
ALONE = "none: graded alone"
#: The shell that joins the grader's groups, then becomes the grader (same pid).
JOIN = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; '
    'n=$((n - 1)); done; exec "$@"'
)
#: The exit status of a grader that could not join its groups.
NOT_JOINED = 97

_COUNTER = itertools.count()


@dataclass(frozen=True)
class Controlled:
    """One grading's group in one hierarchy, with the controllers it limits there."""

    path: Path
    version: int
    controllers: tuple[str, ...]
    settings: tuple[str, ...]  # what was written, for the results

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")


@dataclass
class GradingGroup:
    """The groups of one grading: every process in them is limited together."""

    groups: list[Controlled] = field(default_factory=list)

    @property
    def mode(self) -> str:
        """What the grading's processes share, for the results (``extra_data``)."""
        if not self.groups:
            return NO_GROUP
        return "; ".join(f"cgroup v{g.version} " + ", ".join(g.settings) for g in self.groups)

    @property
    def procs_files(self) -> list[str]:
        return [g.procs_file for g in self.groups]

    def command(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside the groups: a shell writes its own pid to each, then
        becomes ``cmd`` (nothing runs outside them, not even the grader's first line)."""
        if not self.groups:
            return list(cmd)
        files = self.procs_files
        return ["/bin/sh", "-c", JOIN, "sh", str(len(files)), *files, *cmd]

    def join(self, pid: int) -> bool:
        """Move process ``pid`` (all its threads) into every group; False where one
        refused it. For a process that starts nothing until it is told to (a fork server
        offered to the grading), so that all it forks is born inside."""
        for name in self.procs_files:
            try:
                Path(name).write_text(str(pid))
            except OSError:
                return False
        return True

    def remove(self) -> None:
        """Kill what is left in the groups and in groups below them (a worker's clock left
        by a grader that was killed) and delete them."""
        for group in self.groups:
            with contextlib.suppress(OSError):
                for child in sorted(p for p in group.path.iterdir() if p.is_dir()):
                    CpuGroup(child, group.version).remove()
            CpuGroup(group.path, group.version).remove()


def _v2_parent(controller: str) -> Path | None:
    """This process's v2 group, where it hands ``controller`` to groups below it (or can
    be made to: the root of the hierarchy, or a group with no process of its own)."""
    for point, fstype, _ in mount_table():
        own = own_path(None) if fstype == "cgroup2" else None
        if own is None:
            continue
        parent = Path(point) / own.lstrip("/")
        try:
            if controller not in (parent / "cgroup.controllers").read_text().split():
                return None
            if controller not in (parent / "cgroup.subtree_control").read_text().split():
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError:
            return None
        return parent
    return None


def _v1_parent(controller: str) -> Path | None:
    """This process's group in the v1 hierarchy that holds ``controller``."""
    for point, fstype, options in mount_table():
        if fstype == "cgroup" and controller in options.split(","):
            own = own_path(controller)
            return Path(point) / own.lstrip("/") if own is not None else None
    return None


def _limits(controller: str, version: int, cores: float | None, pids: int) -> list[tuple[str, str]]:
    """The files to write for ``controller`` in a group of ``version``, in order."""
    if controller == "pids":
        return [("pids.max", str(pids))]
    wanted = [WEIGHT[version]]
    if cores is not None:
        quota = str(max(1000, int(cores * PERIOD_US)))
        if version == 2:
            wanted.append(("cpu.max", f"{quota} {PERIOD_US}"))
        else:
            wanted += [("cpu.cfs_period_us", str(PERIOD_US)), ("cpu.cfs_quota_us", quota)]
    return wanted


def _settings(files: list[tuple[str, str]], cores: float | None) -> list[str]:
    """How the results name what ``files`` set."""
    said = []
    for name, value in files:
        if name in ("cpu.weight", "cpu.shares", "pids.max"):
            said.append(f"{name} {value}")
        elif name in ("cpu.max", "cpu.cfs_quota_us"):
            said.append(f"{name} ({cores:g} cores)")
    return said


def _make(path: Path, version: int, files: list[tuple[str, str]]) -> bool:
    """Create ``path`` (or reuse it: one v2 folder holds both controllers) and write
    ``files``; False, and nothing left behind, where the kernel refuses any of it."""
    made = False
    try:
        if not path.exists():
            path.mkdir(mode=0o755)
            made = True
        for name, value in files:
            (path / name).write_text(value)
        return True
    except OSError:
        if made:
            CpuGroup(path, version).remove()
        return False


def quota_cores() -> float | None:
    """The cores a grading may use at most (``KVGRADER_GRADING_CPUS``; at least one core,
    since a worker's timed run needs one), or None for a share without a quota."""
    text = os.environ.get(CPUS_ENV, "").strip()
    try:
        return max(1.0, float(text)) if text else None
    except ValueError:
        return None


def pids_limit() -> int:
    """The processes and threads a grading may have (``KVGRADER_GRADING_PIDS``)."""
    try:
        return max(64, int(os.environ.get(PIDS_ENV, GRADING_PIDS)))
    except ValueError:
        return GRADING_PIDS


def create(label: str) -> GradingGroup:
    """The groups for one grading (none where none can be written, or the switch is off).
    ``label`` goes into the folders' names for a reader of ``/sys/fs/cgroup``."""
    grading = GradingGroup()
    if os.environ.get(SWITCH, "1") == "0" or os.geteuid() != 0:
        return grading
    name = f"kvgrading-{os.getpid()}-{next(_COUNTER)}-{label}"
    cores, pids = quota_cores(), pids_limit()
    for controller in ("cpu", "pids"):
        for version, parent in ((2, _v2_parent(controller)), (1, _v1_parent(controller))):
            if parent is None:
                continue
            sweep(parent, "kvgrading")
            files = _limits(controller, version, cores, pids)
            if _make(parent / name, version, files):
                _record(grading, parent / name, version, controller, _settings(files, cores))
                break
    return grading


def _record(
    grading: GradingGroup, path: Path, version: int, controller: str, settings: list[str]
) -> None:
    """Add ``controller``'s group to ``grading``; a v2 folder already there (the other
    controller's) gains it."""
    for i, group in enumerate(grading.groups):
        if group.path == path:
            grading.groups[i] = Controlled(
                path, version, (*group.controllers, controller), (*group.settings, *settings)
            )
            return
    grading.groups.append(Controlled(path, version, (controller,), tuple(settings)))


def recorded_mode() -> str:
    """The CPU isolation of the grading this process runs, for its results: what the
    batch that started it set up, or that it was graded alone."""
    return os.environ.get(MODE_ENV) or ALONE
