"""The worker's private view of the file system (a mount namespace of its own).

As root, before it drops to the worker user, the worker's process leaves the
grader's mount namespace and reshapes its own:

* the grader's checkout (``.git`` with the solution in its history, the mutant
  library, ``dist/``, the cases) and any other folder the run names are covered
  with empty, read-only file systems;
* ``/tmp``, ``/var/tmp`` and ``/dev/shm`` become small private tmpfs mounts, so
  the worker can neither fill the machine's disk nor see another grading's
  sandbox;
* what it must still reach (its sandbox, the interpreter's environment when
  that lives inside a covered folder) is bound back on top.

Nothing of this touches the grader's own view: the parent still reads the
files the worker writes in its sandbox. Where the kernel or the container
forbids it, :func:`mount_isolation` says why and the run carries a warning.
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
READ_ONLY_AGAIN = MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
#: Private scratch space per grading: what the worker may write outside its sandbox.
SCRATCH = {"/tmp": "256m", "/var/tmp": "64m", "/dev/shm": "64m"}


@dataclass(frozen=True)
class MountPlan:
    """What one worker sees: folders covered, folders bound back on top."""

    hide: tuple[str, ...]  # folders covered by an empty read-only tmpfs
    keep: tuple[str, ...]  # folders visible again, at the same path (sandbox, venv)
    scratch: tuple[tuple[str, str], ...] = tuple(SCRATCH.items())  # (folder, tmpfs size)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = _libc()
    ok = libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if ok != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def apply(plan: MountPlan) -> None:
    """Run in the child, as root, before dropping privileges: build the private view.

    The folders to keep are opened first and bound back from those handles
    (``/proc/self/fd/N``), so covering a parent folder cannot lose them.
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNS): {os.strerror(errno)}")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing leaks back out
    handles = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY)) for path in plan.keep]
    for folder, size in plan.scratch:
        if os.path.isdir(folder):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    covered = []  # a hidden folder inside a scratch folder is gone already
    for folder in plan.hide:
        if os.path.isdir(folder):
            _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
            covered.append(folder)
    for path, fd in handles:
        os.makedirs(path, exist_ok=True)  # inside a fresh tmpfs, when covered
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        os.close(fd)
    for folder in covered:  # read-only once the kept folders are bound inside
        _mount("none", folder, None, READ_ONLY_AGAIN, None)


@functools.cache
def mount_isolation() -> str:
    """ "" when a private mount namespace can be built here, else why not (probed once)."""
    if os.geteuid() != 0:
        return "the grader is not root"
    probe = tempfile.mkdtemp(prefix="kvgrade-probe-")
    try:
        pid = os.fork()
        if pid == 0:  # the probe: hide a folder in a namespace of its own
            try:
                apply(MountPlan(hide=(probe,), keep=(), scratch=()))
                os._exit(0)
            except OSError as exc:
                os._exit(min(exc.errno or 1, 255))
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return "" if code == 0 else f"no private mount namespace: {os.strerror(code)}"
    finally:
        os.rmdir(probe)


def plan_for(sandbox_root: Path, hide: list[Path], interpreter: list[Path]) -> MountPlan:
    """The view of a worker whose sandbox is ``sandbox_root``: ``hide`` covered (the
    checkout, an export), and the interpreter's folders (``sys.prefix``,
    ``sys.base_prefix``) bound back wherever they lie inside a covered folder or a
    scratch folder (a clone under /tmp runs its venv from there)."""
    hidden = [p.resolve() for p in hide if p.is_dir()]
    covered = [*hidden, *(Path(folder) for folder in SCRATCH)]
    keep = [sandbox_root.resolve()]
    for prefix in interpreter:
        prefix = prefix.resolve()
        if prefix not in keep and any(prefix.is_relative_to(c) for c in covered):
            keep.append(prefix)
    return MountPlan(hide=tuple(map(str, hidden)), keep=tuple(map(str, keep)))
