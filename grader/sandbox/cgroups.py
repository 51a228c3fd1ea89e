"""A control group per worker: the CPU time of every process a submission starts.

A process tree can hide work from a clock that reads it: a helper that reaps its own
children keeps their time in its ``cutime`` until it exits, and a helper made with
``clone(CLONE_PARENT)`` is a child of the worker's parent, which reaps it. A cgroup has
no such gap: every process the worker starts is born in the worker's group, whoever its
parent becomes and whoever reaps it, and the kernel adds each one's CPU time to the
group's counter (cgroup v2 ``cpu.stat``, or v1 ``cpuacct.usage``). The worker joins its
group as root before it drops to the worker account, and cannot leave it: the group's
files belong to root.

Where no cgroup hierarchy can be written (a container with a read-only
``/sys/fs/cgroup``, a grader that is not root) :func:`create` returns None and the
timing falls back to reading the process tree (:mod:`grader.runtime.timing`); the
results say which accounting a grading used.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

#: Set to "0" to time without cgroups (the fallback's tests; a TA's diagnosis).
CGROUPS_ENV = "KVGRADER_CGROUPS"
#: What a grading's results call each accounting (``extra_data["cpu_accounting"]``).
V2, V1, PROCESS_TREE = "cgroup v2 (cpu.stat)", "cgroup v1 (cpuacct)", "process tree"

_COUNTER = itertools.count()


@dataclass(frozen=True)
class CpuGroup:
    """One worker's cgroup: the folder the kernel keeps its processes and CPU time in."""

    path: Path
    version: int  # 2: cpu.stat's usage_usec; 1: cpuacct.usage (ns)

    @property
    def procs_file(self) -> str:
        """The file a process writes its pid to, to join the group (as root)."""
        return str(self.path / "cgroup.procs")

    @property
    def accounting(self) -> str:
        return V2 if self.version == 2 else V1

    def usage_s(self) -> float | None:
        """CPU seconds used so far by every process that was ever in the group (None if
        the counter cannot be read)."""
        try:
            if self.version == 2:
                for line in (self.path / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec":
                        return int(value) / 1e6
                return None
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def waiting_s(self) -> float | None:
        """Seconds so far during which some process of the group could run but waited
        for a CPU (v2 ``cpu.pressure``, "some" total; None in v1 or where the kernel keeps
        no pressure figures): the evidence that a slow request was starved, not asleep."""
        if self.version != 2:
            return None
        try:
            for line in (self.path / "cpu.pressure").read_text().splitlines():
                if line.startswith("some "):
                    fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                    return int(fields["total"]) / 1e6
        except (OSError, ValueError, KeyError):
            return None
        return None

    def pids(self) -> list[int]:
        """The processes in the group now."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self, wait_s: float = 2.0) -> None:
        """Kill whatever is still in the group and delete it (a group can be deleted only
        once it is empty; a process being killed may take a moment to leave)."""
        deadline = time.monotonic() + wait_s
        while True:
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)


def mount_table() -> list[tuple[str, str, str]]:
    """(mount point, file system type, options) of every mount this process sees."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4:
            out.append((fields[1].replace("\\040", " "), fields[2], fields[3]))
    return out


def own_path(controller: str | None) -> str | None:
    """This process's cgroup path in the v2 hierarchy (``controller`` None) or in the v1
    hierarchy of ``controller``, from ``/proc/self/cgroup``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        if controller is None and hid == "0" and names == "":
            return path
        if controller is not None and controller in names.split(","):
            return path
    return None


def parents() -> list[tuple[Path, int]]:
    """The folders a worker's group can be made in, best first: this process's own
    cgroup in the v2 hierarchy, then in v1's ``cpuacct`` one."""
    found = []
    for point, fstype, options in mount_table():
        if fstype == "cgroup2":
            own = own_path(None)
            if own is not None:
                found.append((Path(point) / own.lstrip("/"), 2))
        elif fstype == "cgroup" and "cpuacct" in options.split(","):
            own = own_path("cpuacct")
            if own is not None:
                found.append((Path(point) / own.lstrip("/"), 1))
    return sorted(found, key=lambda f: -f[1])


def sweep(parent: Path, prefix: str) -> None:
    """Delete the empty groups in ``parent`` named ``<prefix>-<pid>-...`` whose maker
    ``pid`` is gone (a grader killed before it removed them), and the empty groups inside
    them. Nothing is killed: the kernel refuses to delete a group that holds a process."""
    try:
        stale = [p for p in parent.iterdir() if p.name.startswith(f"{prefix}-")]
    except OSError:
        return
    for group in stale:
        maker = group.name.split("-")[1]
        if not maker.isdigit() or os.path.exists(f"/proc/{maker}"):
            continue
        with contextlib.suppress(OSError):
            for child in [c for c in group.iterdir() if c.is_dir()]:
                child.rmdir()
            group.rmdir()


def create(label: str) -> CpuGroup | None:
    """A new, empty group for one worker (None where no hierarchy can be written, or
    where ``KVGRADER_CGROUPS=0``). ``label`` goes into the folder's name for a reader of
    ``/sys/fs/cgroup``; the name is made unique."""
    if os.environ.get(CGROUPS_ENV, "1") == "0" or os.geteuid() != 0:
        return None
    name = f"kvgrader-{os.getpid()}-{next(_COUNTER)}-{label}"
    for parent, version in parents():
        sweep(parent, "kvgrader")
        group = CpuGroup(parent / name, version)
        try:
            group.path.mkdir(mode=0o755)
        except OSError:
            continue
        if group.usage_s() is not None and os.access(group.procs_file, os.W_OK):
            return group
        group.remove()
    return None
