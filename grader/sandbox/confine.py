"""What a worker's process does to itself before any student code runs: its cgroup (the
CPU clock), resource limits, network and IPC namespaces and a tree of files of its own
(as root, when asked), no new privileges, Landlock's rules where no tree of its own could
be made (:mod:`grader.sandbox.view`), then the drop to the worker account.

Plain data and the standard library only: the same steps run in ``subprocess``'s child
before ``exec`` (:func:`grader.sandbox.forkserver.start_interpreter`) and in a child of the fork
server (:mod:`grader.sandbox.forkserver_main`), which receives a :class:`Confinement` as
JSON and must not load the rest of the grader.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from grader.sandbox.landlock import LandlockRules, restrict
from grader.sandbox.mounts import MountPlan
from grader.sandbox.mounts import apply as apply_mounts

CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
PR_SET_NO_NEW_PRIVS = 38
#: Exit statuses of a worker that could not be confined (the client names them).
NO_CPU_GROUP, NO_IPC_NAMESPACE = 94, 95
#: ``NO_MOUNTS``: its view of the files (a tree of its own, or Landlock's rules) failed.
NO_MOUNTS, NO_NETWORK_NAMESPACE, NO_PRIVILEGE_LOCK = 96, 97, 98


def _unshare(flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return 0 if libc.unshare(flags) == 0 else ctypes.get_errno()


def unshare_network() -> int:
    """Move the calling process into a new, empty network namespace; 0 or an errno."""
    return _unshare(CLONE_NEWNET)


def unshare_ipc() -> int:
    """Move the calling process into a new IPC namespace: System V shared memory,
    message queues and semaphores (which no other namespace scopes) it makes vanish with
    its last process, and it sees none of another grading's; 0 or an errno."""
    return _unshare(CLONE_NEWIPC)


@functools.cache
def ipc_isolation() -> str:
    """ "" when a new IPC namespace can be made here, else why not (probed once, in a
    child). Needs ``CAP_SYS_ADMIN``, which a default Docker container lacks: there the
    worker shares the container's System V IPC (Docker gives each container its own)."""
    return probed(unshare_ipc, "unshare(CLONE_NEWIPC)")


def probed(attempt: Callable[[], int], what: str) -> str:
    """Why ``attempt`` (a call returning 0 or an errno) cannot work here ("" when it can),
    tried in a child that reports by its exit status, so the grader keeps its own state."""
    if os.geteuid() != 0:
        return "the grader is not root"
    pid = os.fork()
    if pid == 0:
        os._exit(min(attempt(), 255))
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return "" if code == 0 else f"{what} failed: {os.strerror(code)}"


def join_group(procs_file: str) -> bool:
    """Move the calling process into the cgroup whose ``cgroup.procs`` is ``procs_file``
    (:mod:`grader.sandbox.cgroups`): every process it starts is born there."""
    try:
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return False
    return True


def no_new_privileges() -> int:
    """From now on no exec can gain privileges (setuid ``sg``, ``su``, file capabilities),
    so the worker can never leave its run's group id; 0 or an errno. Without ``prctl``
    (macOS: a student's self-check) there is nothing to lock for a grader that is not
    root, whose worker runs as the same user anyway."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = getattr(libc, "prctl", None)
    if prctl is None:
        return 0 if os.geteuid() != 0 else errno.ENOSYS
    return 0 if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 else ctypes.get_errno()


@dataclass(frozen=True)
class Confinement:
    """Everything :func:`confine` applies, as plain values."""

    memory_resource: int  # RLIMIT_AS on a CPU, RLIMIT_DATA on a GPU (see Limits.memory_bytes)
    memory_bytes: int
    max_file_bytes: int
    cpu_seconds: int
    max_processes: int | None  # RLIMIT_NPROC, only for a dedicated worker account
    isolate_network: bool
    mounts: MountPlan | None
    uid: int | None  # the worker account to drop to; None keeps the caller's
    gid: int | None
    cgroup_procs: str | None = None  # the worker's cgroup (its CPU clock), joined first
    isolate_ipc: bool = False  # a System V IPC namespace of its own (root only)
    #: The files it may open where no tree of its own (``mounts``) could be built.
    landlock: LandlockRules | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Confinement:
        mounts, rules = data.get("mounts"), data.get("landlock")
        if mounts is not None:
            pairs = {"links", "scratch"}
            mounts = MountPlan(
                **{k: tuple(tuple(v) if k in pairs else v for v in vs) for k, vs in mounts.items()}
            )
        if rules is not None:
            rules = LandlockRules(
                **{k: tuple(v) if isinstance(v, list) else v for k, v in rules.items()}
            )
        return cls(**{**data, "mounts": mounts, "landlock": rules})


def lift_data_ceiling() -> None:
    """In a process the grader started, before it runs anything: the grader's own memory
    ceiling (:mod:`grader.sandbox.ceiling`) lifted, the soft ``RLIMIT_DATA`` back to the
    hard one. Only system calls: safe between fork and exec."""
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))
    except (OSError, ValueError):
        pass


def confine(spec: Confinement) -> None:
    """Apply ``spec`` to the calling process, in that order: the namespaces need root, so
    the drop comes last. A step that fails ends the process with a status of its own
    rather than let student code run with a network or files it was promised not to have.
    """
    if spec.cgroup_procs is not None and not join_group(spec.cgroup_procs):
        os._exit(NO_CPU_GROUP)  # before anything else: no work escapes the clock
    lift_data_ceiling()  # the grader's own memory ceiling is the grader's alone
    resource.setrlimit(spec.memory_resource, (spec.memory_bytes, spec.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec.max_file_bytes, spec.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (spec.cpu_seconds, spec.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec.max_processes is not None:
        # Counts every process and thread of the worker user, so it only makes sense
        # for a dedicated account.
        resource.setrlimit(resource.RLIMIT_NPROC, (spec.max_processes, spec.max_processes))
    if spec.isolate_network and unshare_network() != 0:
        os._exit(NO_NETWORK_NAMESPACE)
    if spec.isolate_ipc and unshare_ipc() != 0:
        os._exit(NO_IPC_NAMESPACE)
    if spec.mounts is not None:
        try:
            apply_mounts(spec.mounts)
        except Exception:
            os._exit(NO_MOUNTS)
    if no_new_privileges() != 0:
        os._exit(NO_PRIVILEGE_LOCK)
    if spec.landlock is not None:  # still root: every rule's folder can be opened
        try:
            restrict(spec.landlock)
        except Exception:
            os._exit(NO_MOUNTS)
    if spec.uid is not None and spec.gid is not None:
        os.setgroups([])
        os.setgid(spec.gid)
        os.setuid(spec.uid)
    os.umask(0o077)
