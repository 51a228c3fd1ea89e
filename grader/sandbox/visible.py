"""What a worker may see of the machine's files: the same list whichever way the kernel
lets the grader enforce it (a file system tree of the worker's own,
:mod:`grader.sandbox.mounts`, or Landlock rules, :mod:`grader.sandbox.landlock`).

* read-only: the system's programs and libraries (``/usr``, ``/lib*``, ``/bin``), the
  interpreter's own folders (``sys.prefix``, ``sys.base_prefix``: the venv and its
  site-packages) where they lie elsewhere, a few files of ``/etc`` that the C library
  and Python read, ``/proc`` and ``/sys``;
* read-write: the grading's sandbox alone;
* devices: ``/dev/null`` and its kind, and the GPU's nodes where the machine has them;
* covered even inside those: the grader's checkout and whatever else the run names,
  and the usual places of source checkouts under ``/usr``.

Nothing else of the host: no home folder, no other checkout, no world-writable host
folder. Plain data and the standard library only (the fork server imports it).
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

#: The system's programs and libraries, read-only (a merged-/usr system's ``/bin`` and
#: ``/lib`` are links into ``/usr``, and stay links).
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: What the C library and the dynamic loader read from ``/etc``: the accounts (without
#: them ``getpass.getuser()`` fails, and torch's compiler names its cache folder with
#: it), where libraries lie (the GPU driver's, on a CUDA machine), host names, the time
#: zone, the system's alternatives that links in ``/usr/bin`` lead through, and
#: fontconfig's settings (matplotlib asks ``fc-list`` for the fonts). The rest of
#: ``/etc`` stays out.
ETC = (
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "hosts",
    "alternatives",
    "fonts",
)
#: Device nodes every process may use, then the GPU's (NVIDIA's, WSL's), where present.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
GPU_DEVICES = ("/dev/nvidia*", "/dev/dxg")
#: Where source checkouts usually lie inside the system's folders: covered.
SOURCE_FOLDERS = ("/usr/src", "/usr/local/src")
#: Private scratch space per grading (folder, tmpfs size), in the worker's own tree only:
#: what the worker may write outside its sandbox, gone with its last process.
SCRATCH = (("/tmp", "256m"), ("/var/tmp", "64m"), ("/dev/shm", "64m"), ("/run", "1m"))


@dataclass(frozen=True)
class Visible:
    """The host paths a worker sees, at their own paths."""

    read_only: tuple[str, ...]  # folders and files, outermost first
    links: tuple[tuple[str, str], ...]  # (path, target): system links kept as links
    hidden: tuple[str, ...]  # folders inside ``read_only`` that are covered
    writable: tuple[str, ...]  # the sandbox
    devices: tuple[str, ...]  # device nodes (and NVIDIA's folder of capabilities)


def _under(path: str, folders: list[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def devices() -> list[str]:
    """The device nodes of :data:`DEVICES` and :data:`GPU_DEVICES` this machine has."""
    found = [d for d in DEVICES if os.path.exists(d)]
    for pattern in GPU_DEVICES:
        found += sorted(glob.glob(pattern))
    return found


def visible(sandbox_root: str, hidden: list[str], interpreter: list[str]) -> Visible:
    """What the worker of the sandbox ``sandbox_root`` sees: :data:`SYSTEM` and
    :data:`ETC`, the ``interpreter`` folders wherever the system's folders do not
    already show them (or a covered folder hides them), ``hidden`` and
    :data:`SOURCE_FOLDERS` covered where they lie inside what is shown."""
    read_only, links = [], []
    for path in SYSTEM:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            read_only.append(path)
    read_only += [f"/etc/{name}" for name in ETC if os.path.exists(f"/etc/{name}")]
    shown = [os.path.realpath(p) for p in read_only if os.path.isdir(p)]
    covered = []
    for folder in [*hidden, *SOURCE_FOLDERS]:
        real = os.path.realpath(folder)
        if os.path.isdir(real) and _under(real, shown) and real not in covered:
            covered.append(real)
    for prefix in map(os.path.abspath, interpreter):
        real = os.path.realpath(prefix)
        hidden_here = not _under(real, shown) or _under(real, covered)
        if os.path.isdir(real) and hidden_here and prefix not in read_only:
            read_only.append(prefix)
    return Visible(
        read_only=tuple(read_only),
        links=tuple(links),
        hidden=tuple(covered),
        writable=(os.path.abspath(sandbox_root),),
        devices=tuple(devices()),
    )


def depth(path: str) -> int:
    """How many folders deep ``path`` lies: a folder is set up before what lies inside."""
    return len([part for part in path.split("/") if part])
