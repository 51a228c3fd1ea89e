"""Who runs student code: an unprivileged account of the worker pool, one per grading.

As root (always on Gradescope) the worker drops to an account created by the
set-up; gradings running side by side each hold their own account through a
lock, so they share neither a process limit nor files nor signals, and each
grading's processes carry a run gid of its own (:func:`fresh_gid`), by which they are
all killed. The reference solution's trusted workers run as an account of their own
(:data:`TRUSTED_USER`), never as root where the set-up made it. Without root the
worker runs as the current user and the run records a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import os
import pwd
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from grader.sandbox.processes import kill_matching

#: The dedicated accounts created by the Gradescope set-up (``setup.sh``): ``kvgrader``
#: and ``kvgrader1`` ... ``kvgrader7``, one per grading running at the same time.
WORKER_USER = "kvgrader"
POOL_SIZE = 8
#: Root-only folder of the locks that give each running grading its own account.
LOCK_DIR = Path("/run/kvgrader") if Path("/run").is_dir() else Path("/var/lock/kvgrader")
#: Used when running as root on a machine without the dedicated account.
FALLBACK_USER = "nobody"
#: The account of trusted workers (the reference solution timed as the yardstick), created
#: with the pool: a root grader never runs the reference as root where it exists.
TRUSTED_USER = f"{WORKER_USER}-ref"
#: Set by ``batch``: where a grading writes its worker's uid and run gid, so that the
#: batch can sweep the worker's processes even after killing that grading.
RUN_RECORD_ENV = "KVGRADER_RUN_RECORD"


@dataclass(frozen=True)
class WorkerIdentity:
    """The account the worker runs as, and why."""

    uid: int
    gid: int
    name: str
    dropped: bool  # True when the worker runs as a different, unprivileged user
    warning: str = ""
    lock_fd: int = -1  # held while a grading uses a pool account (see claim_identity)


#: What the worker account runs to show it can use this interpreter and its packages.
FINDS_PACKAGES = "import importlib.util as u; raise SystemExit(u.find_spec('numpy') is None)"


@functools.cache
def _interpreter_usable_by(uid: int, gid: int) -> bool:
    """Whether ``uid`` can start this interpreter (a pyenv under /root is not readable) and
    find its packages (numpy stands for them: found, not imported, which would cost a
    grading a tenth of a second). Asked once per account in a process (one that grades
    many submissions, as a TA's script or the test suite does, would otherwise start an
    interpreter for each): the answer does not change while it runs."""
    try:
        result = subprocess.run(
            [sys.executable, "-E", "-s", "-c", FINDS_PACKAGES],
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def fresh_gid() -> int:
    """A group id no running process has: this grading run's tag.

    The worker runs as (worker user, this gid). An unprivileged process cannot
    change its real gid, so everything the submission starts, even after
    ``setsid`` or a double fork, carries it, and only this run's processes are
    killed at the end, never those of a grading running beside it.
    """
    in_use = set()
    for proc in psutil.process_iter(["gids"]):
        with contextlib.suppress(psutil.Error, TypeError):
            in_use.add(proc.info["gids"].real)
    while True:
        gid = secrets.randbelow(2**30) + 2**24  # far above any gid in /etc/group
        if gid not in in_use:
            return gid


def kill_user_processes(identity: WorkerIdentity) -> int:
    """Kill every process of this grading run (worker user and run gid); return how many.

    Repeated until none is left, so a process forking while it is killed is caught too.
    """
    if not identity.dropped:
        return 0
    return kill_matching(
        lambda p: p.info["uids"].real == identity.uid and p.info["gids"].real == identity.gid,
        ["uids", "gids"],
    )


def missing_account(preferred: str, used: str, who: str = "student code") -> str:
    """The warning when an account of the set-up (the worker's, or the reference's) is
    missing, with the one command (as root) that creates them, as Gradescope's set-up does."""
    script = Path(__file__).resolve().with_name("create_worker_user.sh")
    pool = WORKER_USER if preferred == TRUSTED_USER else preferred
    return (
        f"user {preferred!r} does not exist; {who} runs as {used!r}. Create the worker "
        f"accounts once, as root: bash {script} {pool} {POOL_SIZE}"
    )


def resolve_identity(preferred: str = WORKER_USER) -> WorkerIdentity:
    """Pick the worker's account: unprivileged when we are root, else ourselves."""
    me = pwd.getpwuid(os.getuid())
    if os.getuid() != 0:
        return WorkerIdentity(
            os.getuid(),
            os.getgid(),
            me.pw_name,
            dropped=False,
            warning=(
                f"the grader is not running as root, so student code runs as {me.pw_name!r} "
                "and can read whatever that user can read"
            ),
        )
    for name in (preferred, FALLBACK_USER):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        if _interpreter_usable_by(entry.pw_uid, entry.pw_gid):
            note = "" if name == preferred else missing_account(preferred, name)
            return WorkerIdentity(entry.pw_uid, entry.pw_gid, name, dropped=True, warning=note)
    return WorkerIdentity(
        0,
        0,
        me.pw_name,
        dropped=False,
        warning=(
            f"no unprivileged user ({preferred!r} or {FALLBACK_USER!r}) can run {sys.executable}; "
            "student code runs as root"
        ),
    )


def pool_names(preferred: str = WORKER_USER, size: int = POOL_SIZE) -> list[str]:
    """The accounts of the worker pool, in the order they are tried."""
    return [preferred, *(f"{preferred}{i}" for i in range(1, size))]


def claim_identity(preferred: str = WORKER_USER, size: int = POOL_SIZE) -> WorkerIdentity:
    """An account no other running grading uses, held by a lock until
    :meth:`Sandbox.cleanup`. Gradings side by side (``batch --jobs``) then have
    their own user: their own process limit, no signals or files across them.
    Without a free pool account the first one is shared, with a warning."""
    if os.geteuid() != 0:
        return resolve_identity(preferred)
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    busy, unusable = [], []
    for name in pool_names(preferred, size):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(LOCK_DIR / f"{name}.lock", flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            busy.append(name)
            continue
        identity = resolve_identity(name)
        if identity.name == name:
            return dataclasses.replace(identity, lock_fd=fd)
        os.close(fd)
        unusable.append(name)
    identity = resolve_identity(preferred)
    if unusable:  # the true cause: the accounts are there but cannot run this python
        note = (
            f"the worker accounts ({', '.join(unusable)}) cannot run {sys.executable}, so "
            f"student code runs as {identity.name!r}: make that python and its folders "
            "readable by them (a virtual environment under /root is not)"
        )
        return dataclasses.replace(identity, warning=note)
    elif busy:
        note = "every worker account is in use: this grading shares its worker user"
    else:  # no pool: resolve_identity's warning already says which account is used
        return identity
    return dataclasses.replace(identity, warning="; ".join(filter(None, [identity.warning, note])))


def trusted_identity(worker: WorkerIdentity, name: str = TRUSTED_USER) -> WorkerIdentity:
    """The account a trusted worker (the reference solution) of a grading whose worker
    runs as ``worker`` runs as: as root, the account ``name`` where it exists and can run
    this interpreter, else root itself (its files and folders are still its own: see
    ``Sandbox.trusted_dir``); the grader's own user when the grader is not root. Its gid
    is given by the sandbox (a run gid of its own, as the worker's)."""
    if not worker.dropped:
        return dataclasses.replace(worker, warning="", lock_fd=-1)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return WorkerIdentity(0, 0, "root", dropped=False)
    if not _interpreter_usable_by(entry.pw_uid, entry.pw_gid):
        return WorkerIdentity(0, 0, "root", dropped=False)
    return WorkerIdentity(entry.pw_uid, entry.pw_gid, name, dropped=True)
