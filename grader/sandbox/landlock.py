"""The worker's view of the files where no mount namespace can be made (a default Docker
container has no ``CAP_SYS_ADMIN``): Landlock, which any process may apply to itself.

The worker's process restricts itself, after ``PR_SET_NO_NEW_PRIVS`` and before it drops
to the worker account, to what :func:`grader.sandbox.visible.visible` lists: reading
(and running) only under the system's folders, the interpreter's and the few files of
``/etc``, ``/proc`` and ``/sys``; reading and writing only in its sandbox; the few device
nodes it needs. A folder to cover inside a shown one (the grader's checkout) is left out
by showing its neighbours one by one instead. Where the kernel offers scopes (ABI 6) the
worker can also neither signal nor reach the abstract Unix sockets of processes outside
its domain; where it has no network namespace (ABI 4) it can neither connect nor listen
over TCP. What it cannot do that a tree of its own does: there is no private scratch
(the host's ``/tmp`` is closed to it; its ``TMPDIR`` is in the sandbox), it can still
learn that a path exists (``stat``), never what a file holds or a folder lists, and UDP
stays open where there is no network namespace.

Plain data and the standard library only (the fork server imports it).
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

from grader.sandbox.visible import Visible

#: Landlock's system calls (the same numbers on every architecture).
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
# File-system rights (``LANDLOCK_ACCESS_FS_*``), in order of their bits.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
#: Every right of ABI 1 (bits 0-12), then ABI 2's REFER, 3's TRUNCATE, 5's IOCTL_DEV.
RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
TRUNCATE, IOCTL_DEV = 1 << 14, 1 << 15
#: The rights a rule on a file (not a folder) may carry.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV
#: ABI 6's scopes: no signal to, and no abstract Unix socket of, a process outside.
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
#: ABI 4's network rights: binding and connecting TCP sockets.
BIND_TCP, CONNECT_TCP = 1, 2


class RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass(frozen=True)
class LandlockRules:
    """What one worker may open: read-only, read-write, and as a device."""

    read: tuple[str, ...]
    write: tuple[str, ...]
    devices: tuple[str, ...]
    #: No TCP at all (ABI 4): where no network namespace could be made, the worker
    #: can still neither connect nor listen (UDP is not Landlock's to close).
    close_tcp: bool = False


def _syscall(number: int, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(ctypes.c_long(number), *args)


@functools.cache
def abi_version() -> int:
    """The Landlock ABI this kernel offers; 0 where it offers none (an old kernel,
    Landlock left out of the boot's security modules, a seccomp filter that refuses it)."""
    try:
        version = _syscall(CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    except (AttributeError, OSError):  # no C library to call (not Linux)
        return 0
    return max(version, 0)


def handled_rights(abi: int) -> int:
    """Every file-system right ABI ``abi`` knows: what is not granted is refused."""
    known = [rights for since, rights in RIGHTS_BY_ABI.items() if since <= abi]
    return max(known, default=0)


def _shown_apart(folder: str, hidden: tuple[str, ...]) -> list[str]:
    """``folder`` itself where nothing in ``hidden`` lies inside it, else its entries
    one by one (those holding a hidden folder opened up the same way), the hidden
    folders left out."""
    real = os.path.realpath(folder)
    inside = [h for h in hidden if h.startswith(real.rstrip("/") + "/")]
    if real in hidden:
        return []
    if not inside:
        return [folder]
    shown = []
    try:
        entries = sorted(os.scandir(real), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:  # a link is shown where what it leads to is, never through it
        if not entry.is_symlink():
            shown += _shown_apart(entry.path, hidden)
    return shown


def rules_for(seen: Visible, close_tcp: bool = False) -> LandlockRules:
    """The rules that give a worker what ``seen`` lists, and only that (and no TCP,
    where ``close_tcp``)."""
    read = ["/proc", "/sys"]
    for path in seen.read_only:
        read += _shown_apart(path, seen.hidden)
    read += [target for path, target in seen.links if os.path.isabs(target)]
    return LandlockRules(tuple(read), seen.writable, seen.devices, close_tcp=close_tcp)


def _add(ruleset: int, path: str, rights: int) -> None:
    """Grant ``rights`` beneath ``path`` (a file's rule keeps its file rights only)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone since the plan: nothing to grant
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            rights &= FILE_RIGHTS
        rule = PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        if _syscall(ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"landlock_add_rule {path}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def restrict(rules: LandlockRules) -> None:
    """Apply ``rules`` to the calling process and all it starts, for good. Needs
    ``PR_SET_NO_NEW_PRIVS`` set already (or ``CAP_SYS_ADMIN``); raises ``OSError``
    where the kernel refuses, so that no student code runs with a view it was not given."""
    abi = abi_version()
    if abi < 1:
        raise OSError(38, "Landlock is not available")
    handled = handled_rights(abi)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    net = BIND_TCP | CONNECT_TCP if rules.close_tcp and abi >= 4 else 0
    attr = RulesetAttr(handled_access_fs=handled, handled_access_net=net, scoped=scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8  # the fields this ABI knows
    ruleset = _syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"landlock_create_ruleset: {os.strerror(errno)}")
    try:
        for path in rules.read:
            _add(ruleset, path, READ & handled)
        for path in rules.write:
            _add(ruleset, path, handled)
        for path in rules.devices:
            _add(ruleset, path, DEVICE & handled)
        if _syscall(RESTRICT_SELF, ruleset, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"landlock_restrict_self: {os.strerror(errno)}")
    finally:
        os.close(ruleset)
