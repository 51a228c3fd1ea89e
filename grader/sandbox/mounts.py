"""The worker's own tree of files (a mount namespace of its own, a new root).

As root, before it drops to the worker user, the worker's process leaves the grader's
mount namespace and moves to a root built for it alone (``pivot_root`` into an empty
tmpfs) that holds only what :func:`grader.sandbox.visible.visible` lists:

* the system's programs and libraries, the interpreter's folders and a few files of
  ``/etc``, bound read-only at their own paths (covered inside them: the grader's
  checkout and the usual places of source checkouts);
* a ``/proc`` of its own that shows no other account's processes (``hidepid``),
  ``/sys`` read-only, a ``/dev`` of the few device nodes it needs;
* private tmpfs for ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run``, gone with its last
  process, so the worker can neither fill the machine's disk nor see another grading;
* its sandbox, read-write, at the same path as in the grader's view.

Nothing else of the host is there: no home folder, no other checkout of the kit, no
world-writable host folder. The grader's own view is untouched: the parent still reads
the files the worker writes in its sandbox. Where the kernel or the container forbids
it, :func:`mount_isolation` says why (and :mod:`grader.sandbox.view` falls back to
Landlock). Plain data and the standard library only (the fork server imports it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grader.sandbox.visible import SCRATCH, depth, visible

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
#: ``mount_setattr`` (the same number on every architecture), and its flag for a whole tree.
MOUNT_SETATTR, AT_RECURSIVE = 442, 0x8000
READ_ONLY_AGAIN = MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
#: ``pivot_root`` has no C library wrapper: its system call number.
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
#: Where the new root is put together, in the worker's namespace only (the host's
#: folder there is never written).
STAGING = "/tmp"


@dataclass(frozen=True)
class MountPlan:
    """One worker's tree: what is bound into it, covered in it and scratch in it."""

    read_only: tuple[str, ...]  # host folders and files, bound read-only at their paths
    links: tuple[tuple[str, str], ...]  # (path, target) links made in the new root
    hide: tuple[str, ...]  # folders inside ``read_only`` covered by an empty tmpfs
    keep: tuple[str, ...]  # bound read-write: the sandbox
    devices: tuple[str, ...]  # device nodes bound into ``/dev``
    scratch: tuple[tuple[str, str], ...] = SCRATCH  # (folder, tmpfs size)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    ok = _libc().mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if ok != 0:
        raise _fail(f"mount {source} on {target}")


def _tmpfs(target: str, size: str, mode: str) -> None:
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}")


def _mount_point(target: str, folder: bool) -> None:
    """An empty folder, or an empty file for a file to be bound, at ``target``."""
    if folder:
        os.makedirs(target, mode=0o755, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if not os.path.exists(target):
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))


class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clear", "propagation", "userns")]


def _restrict_all(target: str, flags: int) -> None:
    """``flags`` (of ``MS_RDONLY``, ``MS_NOSUID``, ``MS_NODEV``) on the mount at ``target``
    and every mount inside it (``mount_setattr``, Linux 5.12: a container's driver
    libraries are mounts of their own under ``/usr``); the top one alone on an older
    kernel, whose remount cannot reach further."""
    attr = MountAttr(set=flags & (MS_RDONLY | MS_NOSUID | MS_NODEV))  # the same bits
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    done = libc.syscall(
        ctypes.c_long(MOUNT_SETATTR),
        ctypes.c_int(-100),  # AT_FDCWD
        target.encode(),
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if done != 0:
        _mount("none", target, None, flags | MS_REMOUNT | MS_BIND, None)


def _bind(fd: int, target: str, folder: bool, flags: int) -> None:
    """Bind what ``fd`` holds (an ``O_PATH`` handle opened in the host's view), with the
    mounts inside it, on ``target``; then ``flags`` on all of them, when there are any."""
    _mount_point(target, folder)
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC, None)
    if flags:
        _restrict_all(target, flags)


def _steps(plan: MountPlan) -> list[tuple[int, int, str, str]]:
    """Every step of the tree as (depth, order, kind, path): a folder is set up before
    anything inside it, and at one depth the kinds in this order."""
    kinds = {"scratch": 0, "dev": 0, "link": 1, "ro": 2, "hide": 3, "rw": 4, "node": 5}
    steps = [(folder, "scratch") for folder, _ in plan.scratch]
    steps += [("/dev", "dev"), *((path, "link") for path, _ in plan.links)]
    steps += [(p, "ro") for p in plan.read_only] + [(p, "hide") for p in plan.hide]
    steps += [(p, "rw") for p in plan.keep] + [(p, "node") for p in plan.devices]
    return sorted((depth(p), kinds[kind], kind, p) for p, kind in steps)


def _build(root: str, plan: MountPlan, handles: dict[str, int]) -> list[str]:
    """Fill the empty tmpfs at ``root`` as ``plan`` says; return what to make
    read-only once everything inside is bound."""
    sizes, targets, later = dict(plan.scratch), dict(plan.links), [root]
    for _, _, kind, path in _steps(plan):
        target = root + path
        if kind == "scratch":
            os.makedirs(target, mode=0o755, exist_ok=True)
            _tmpfs(target, sizes[path], "1777")
        elif kind in ("dev", "hide"):  # empty, and read-only once filled
            os.makedirs(target, mode=0o755, exist_ok=True)
            _tmpfs(target, "1m", "755")
            later.append(target)
        elif kind == "link":
            os.symlink(targets[path], target)
        elif path in handles:
            folder = os.path.isdir(f"/proc/self/fd/{handles[path]}")
            flags = {"ro": MS_RDONLY | MS_NOSUID | MS_NODEV, "rw": MS_NOSUID | MS_NODEV}
            _bind(handles[path], target, folder, flags.get(kind, 0))
    return later


def _system_mounts(root: str) -> None:
    """``/proc`` (its own instance: no other account's processes), ``/sys`` read-only,
    and the links every ``/dev`` has."""
    os.makedirs(root + "/proc", mode=0o555, exist_ok=True)
    try:
        _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    except OSError:  # a container that forbids a new instance: the host's, bound
        _mount("/proc", root + "/proc", None, MS_BIND | MS_REC, None)
    if os.path.isdir("/sys"):
        os.makedirs(root + "/sys", mode=0o555, exist_ok=True)
        _mount("/sys", root + "/sys", None, MS_BIND | MS_REC, None)
        _restrict_all(root + "/sys", MS_RDONLY | MS_NOSUID | MS_NODEV)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{root}/dev/{name}")
    for number, name in enumerate(("stdout", "stderr"), start=1):
        os.symlink(f"/proc/self/fd/{number}", f"{root}/dev/{name}")


def _pivot(root: str) -> None:
    """Make ``root`` the process's ``/`` and let go of the host's tree entirely."""
    number = PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown on {platform.machine()}")
    os.chdir(root)
    if _libc().syscall(number, b".", b".") != 0:
        raise _fail("pivot_root")
    if _libc().umount2(b".", MNT_DETACH) != 0:
        raise _fail("umount the host's tree")
    os.chdir("/")


def apply(plan: MountPlan) -> None:
    """Run in the child, as root, before dropping privileges: move into the new tree.

    Everything to bind is opened first (``O_PATH``) and bound from those handles
    (``/proc/self/fd/N``), so putting the tree together over :data:`STAGING` loses
    none of it. The working folder is entered again by its path in the new tree: the
    old one would still lead back into the host's.
    """
    libc = _libc()
    if libc.unshare(CLONE_NEWNS) != 0:
        raise _fail("unshare(CLONE_NEWNS)")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing leaks back out
    cwd = os.getcwd()
    handles: dict[str, int] = {}
    try:
        for path in (*plan.read_only, *plan.keep, *plan.devices):
            with contextlib.suppress(OSError):  # gone since the plan: not shown
                handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        root = os.path.realpath(STAGING)
        _tmpfs(root, "4m", "755")
        later = _build(root, plan, handles)
        _system_mounts(root)
    finally:
        for fd in handles.values():
            os.close(fd)
    for folder in reversed(later):  # inner covers first, the new root last
        _mount("none", folder, None, READ_ONLY_AGAIN, None)
    _pivot(root)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir("/")


def plan_for(sandbox_root: Path, hide: list[Path], interpreter: list[Path]) -> MountPlan:
    """The tree of a worker whose sandbox is ``sandbox_root``: what
    :func:`~grader.sandbox.visible.visible` lists, ``hide`` (the checkout, an export)
    covered wherever it lies inside the folders shown, the ``interpreter`` folders
    (``sys.prefix``, ``sys.base_prefix``) bound where the system's do not show them."""
    seen = visible(str(sandbox_root), [str(p) for p in hide], [str(p) for p in interpreter])
    return MountPlan(
        read_only=seen.read_only,
        links=seen.links,
        hide=seen.hidden,
        keep=seen.writable,
        devices=seen.devices,
    )


def _probe(plan: MountPlan) -> int:
    """In a child: build ``plan``'s tree and exit 0, or with the errno that stopped it."""
    pid = os.fork()
    if pid == 0:
        try:
            apply(plan)
            os.listdir("/")
            os._exit(0)
        except OSError as exc:
            os._exit(min(exc.errno or 1, 255))
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@functools.cache
def mount_isolation() -> str:
    """ "" when a worker's own tree can be built here, else why not (probed once, with
    a tree like a worker's, in a child)."""
    if os.geteuid() != 0:
        return "the grader is not root"
    probe = tempfile.mkdtemp(prefix="kvgrade-probe-")
    try:
        interpreter = [Path(sys.prefix), Path(sys.base_prefix)]
        code = _probe(plan_for(Path(probe), [], interpreter))
        return "" if code == 0 else f"no private mount namespace: {os.strerror(code)}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
