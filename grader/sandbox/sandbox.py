"""Where and as whom untrusted code runs: the sandbox folder, the worker user, the limits.

The parent creates one sandbox per grading run: a private temporary folder
holding a copy of the submission and of the worker scripts. When the grader
runs as root (always on Gradescope) the worker runs as an unprivileged user
that owns only that folder; elsewhere it runs as the current user and the
run records a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import resource
import shutil
import subprocess
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from grader.core.paths import CACHE_PATTERNS, PARTS_SOURCE, WORKER_SOURCE
from grader.sandbox.confine import Confinement, ipc_isolation, probed, unshare_network
from grader.sandbox.identity import (  # noqa: F401  (re-exported: the sandbox's accounts)
    FALLBACK_USER,
    LOCK_DIR,
    POOL_SIZE,
    TRUSTED_USER,
    WORKER_USER,
    WorkerIdentity,
    claim_identity,
    fresh_gid,
    kill_user_processes,
    missing_account,
    pool_names,
    resolve_identity,
    trusted_identity,
)
from grader.sandbox.mounts import MountPlan
from grader.sandbox.sysv import remove_ipc_objects

KIB, MIB, GIB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to every worker process and every request."""

    request_timeout_s: float = 20.0  # wall clock for one request
    startup_timeout_s: float = 60.0  # wall clock for importing the submission
    # Wall clock for the whole grading, under Gradescope's default 10 minutes: past it
    # the watchdog stops the workers, so the remaining checks fail fast (runner.py).
    grading_timeout_s: float = 480.0
    # Memory of the worker: address space (RLIMIT_AS) on CPU; on a GPU the data segment
    # (RLIMIT_DATA), because CUDA reserves ~18 GB of address space when it starts and
    # fails under an address-space limit, while RLIMIT_DATA still bounds host memory.
    memory_bytes: int = 6 * GIB
    max_processes: int = 512  # processes + threads of the worker user (RLIMIT_NPROC)
    max_file_bytes: int = 64 * MIB  # largest file the worker may write (RLIMIT_FSIZE)
    max_output_bytes: int = 64 * KIB  # captured stdout/stderr kept per worker
    # Largest answer the parent will read (the largest real one is under 5 MiB). A reply
    # is held about twice while it is checked: this keeps a grading inside 768 MB.
    max_response_bytes: int = 64 * MIB
    cpu_seconds: int = 1800  # CPU time backstop (RLIMIT_CPU)
    # How far the grader's own data segment may grow while its checks run, above what it
    # held when they began (grader/sandbox/ceiling.py): a full CPU grading of the
    # reference grows it by a few tens of MB; a check past it fails, the others run.
    grader_headroom_bytes: int = 256 * MIB
    isolate_network: bool = True  # a network namespace of its own, where the kernel allows


def protect_hidden(folder: Path, identity: WorkerIdentity) -> None:
    """Make a secret folder (hidden test data, the reference solution) unreadable to the
    worker user (owner-only, owned by us)."""
    if identity.dropped and folder.is_dir() and folder.stat().st_uid == os.getuid():
        folder.chmod(0o700)


#: World-writable places a worker can fill outside its sandbox; swept after each run.
SHARED_TEMP = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


@functools.cache
def network_isolation() -> str:
    """ "" when a new network namespace can be made here, else why not (probed once).

    Needs root and CAP_SYS_ADMIN: true on a VM or a privileged container, often
    false in a default Docker container, where the worker keeps the network.
    """
    return probed(unshare_network, "unshare(CLONE_NEWNET)")


def memory_limit(device: str) -> int:
    """The rlimit that bounds a worker's memory on ``device`` (see ``Limits.memory_bytes``)."""
    return resource.RLIMIT_DATA if device == "cuda" else resource.RLIMIT_AS


def confinement(
    limits: Limits,
    identity: WorkerIdentity,
    isolate_network: bool = False,
    mounts: MountPlan | None = None,
    device: str = "cpu",
    cgroup_procs: str | None = None,
    trusted: bool = False,
) -> Confinement:
    """What a worker's process applies to itself before it runs the submission: resource
    limits, a network namespace and a private view of the file system (as root, when
    asked), no new privileges, then the drop to the worker user (see :func:`confine`; a
    started worker applies it as its ``preexec_fn``, rather than through Popen's
    ``user=``, because making the namespaces needs root and must come first). A
    ``trusted`` worker (the reference, as ``TRUSTED_USER``) has no process limit: that
    account is shared by the gradings of a batch, and its code is the kit's."""
    return Confinement(
        memory_resource=memory_limit(device),
        memory_bytes=limits.memory_bytes,
        max_file_bytes=limits.max_file_bytes,
        cpu_seconds=limits.cpu_seconds,
        max_processes=limits.max_processes if identity.dropped and not trusted else None,
        isolate_network=isolate_network,
        mounts=mounts,
        uid=identity.uid if identity.dropped else None,
        gid=identity.gid if identity.dropped else None,
        cgroup_procs=cgroup_procs,
        # Root's grading: System V IPC objects would otherwise outlive the worker (where
        # the kernel allows it: a default Docker container does not, and warns).
        isolate_ipc=identity.dropped and not ipc_isolation(),
    )


#: PyTorch's CUDA allocator for a worker, unless the TA sets one (``PASSED_FROM_GRADER``):
#: segments that grow in place, so that a cache-free generation's attention scores, a new
#: size at every step, reuse one segment instead of each leaving a block cached (NVML saw
#: a Part 3 worker hold 87.9 GB for a 3.9 GB peak of its own without it).
CUDA_ALLOCATOR = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

#: glibc's heap for a worker and for the fork server it is forked from (whose heap it
#: inherits): blocks under 32 MiB come from the heap, and up to 128 MiB freed at its top
#: stays there. By default glibc hands such blocks back to the kernel, which zeroes their
#: pages again a step later (a cache-free step's tensors take a new size at every step):
#: a sixth of a CPU grading's CPU time was the kernel's, and these settings take 0.7-1 s
#: of it away (docs/measurements/2026-11-28-worker-heap.md). Where the grader's
#: environment sets one of them (``PASSED_FROM_GRADER``), its value is taken.
MALLOC_SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(128 << 20),
}

#: What the grader's own environment may hand the worker: which GPUs this grading was given
#: (a Slurm task's ``CUDA_VISIBLE_DEVICES``; without it every grading on a node of several
#: GPUs would run on the first) and how PyTorch's CUDA allocator is set up, a TA's choice.
PASSED_FROM_GRADER = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    *MALLOC_SETTINGS,
)
ALLOCATOR_SETTINGS = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}


def worker_environment(root: Path | None, device: str, threads: int) -> dict[str, str]:
    """A worker's whole environment, its home and temporary folder in ``root`` (the
    sandbox's, or a trusted worker's own ``Sandbox.trusted_dir``);
    with no root (a fork server's, which has no sandbox) they point nowhere useful, and
    each forked worker gets its own sandbox's. Of the grader's environment only
    ``PASSED_FROM_GRADER`` goes through, where it is set; on a GPU, ``CUDA_ALLOCATOR``
    where the TA set no allocator of their own; ``MALLOC_SETTINGS`` on every device."""
    home, tmp = (root / "home", root / "tmp") if root is not None else ("/nonexistent", "/tmp")
    passed = {name: os.environ[name] for name in PASSED_FROM_GRADER if name in os.environ}
    default_allocator = device == "cuda" and not passed.keys() & ALLOCATOR_SETTINGS
    allocator = CUDA_ALLOCATOR if default_allocator else {}
    return {
        **MALLOC_SETTINGS,
        **allocator,
        **passed,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "MPLCONFIGDIR": str(tmp),
        "MPLBACKEND": "Agg",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "KVGRADER_DEVICE": device,
    }


def copy_worker_scripts(target: Path) -> None:
    """The worker's scripts, flat in ``target``: ``grader/worker``'s modules, each part's
    adapter as ``adapter_<part>.py`` and the adapter's own modules (``adapter_<name>.py``)
    as ``adapter_<part>_<name>.py``. Nothing else of the grader reaches the sandbox."""
    shutil.copytree(WORKER_SOURCE, target, ignore=shutil.ignore_patterns(*CACHE_PATTERNS))
    for adapter in sorted(PARTS_SOURCE.glob("part*/adapter*.py")):
        name = adapter.stem.replace("adapter", f"adapter_{adapter.parent.name}", 1)
        shutil.copyfile(adapter, target / f"{name}.py")


@dataclass
class Sandbox:
    """A private folder with the worker scripts and a copy of the submission."""

    root: Path
    identity: WorkerIdentity
    warnings: list[str] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)  # folders the worker must not see
    expired: threading.Event = field(default_factory=threading.Event)  # the run's deadline
    #: Who trusted workers run as (see :meth:`trusted_identity`), once asked.
    trusted: WorkerIdentity | None = None

    @property
    def worker_dir(self) -> Path:
        return self.root / "worker"

    @property
    def submission_dir(self) -> Path:
        return self.root / "submission"

    @property
    def out_dir(self) -> Path:
        return self.root / "out"

    @property
    def trusted_dir(self) -> Path:
        """The trusted workers' own ``home`` and ``tmp`` (their caches: tiktoken's, the
        fonts matplotlib lists): nothing the submission made is on their paths."""
        return self.root / "trusted"

    def trusted_identity(self) -> WorkerIdentity:
        """The account trusted workers run as (:func:`trusted_identity`: ``TRUSTED_USER``
        under a root grader), with a run gid of its own, as the worker's."""
        if self.trusted is None:
            found = trusted_identity(self.identity)
            if found.dropped:
                found = dataclasses.replace(found, gid=fresh_gid())
            elif self.identity.dropped:  # root, and the set-up made no account for it
                self.warnings.append(missing_account(TRUSTED_USER, "root", "the reference"))
            self.trusted = found
        return self.trusted

    def trusted_folders(self) -> Path:
        """:attr:`trusted_dir` with its ``home`` and ``tmp``, made once in the sandbox's root
        (no worker writes there), owner-only, owned by the trusted account."""
        top = self.trusted_dir
        if not top.is_dir():
            who = self.trusted_identity()
            top.mkdir(mode=0o700)  # fails on anything already there: nothing is followed
            for name in ("home", "tmp"):
                (top / name).mkdir(mode=0o700)
            if who.dropped:
                for path in (top, top / "home", top / "tmp"):
                    os.chown(path, who.uid, who.gid, follow_symlinks=False)
        return top

    @property
    def data_dir(self) -> Path:
        """Grader-provided files the worker may read but not change (public data only)."""
        return self.root / "data"

    def provide(self, source: Path, name: str, *, private: bool = False) -> Path:
        """Copy a public file or folder into :attr:`data_dir`, readable and not writable
        by the worker; return its path there (copied once). A ``private`` copy (the
        reference solution) is the trusted workers' alone for its whole life: owner-only,
        owned by their account (:meth:`trusted_identity`; the grader's where there is
        none), read by them alone (``WorkerClient.trusted``)."""
        dest = self.data_dir / name
        if not dest.exists():
            self.data_dir.mkdir(mode=0o755, exist_ok=True)
            os.chmod(self.data_dir, 0o755)
            if private:  # closed before anything is copied into it
                dest.mkdir(mode=0o700)
            if source.is_dir():
                shutil.copytree(source, dest, symlinks=False, dirs_exist_ok=True)
            else:
                shutil.copy2(source, dest)
            folder, file = (0o700, 0o600) if private else (0o755, 0o644)
            owner = self.trusted_identity() if private else None
            for path in (dest, *dest.rglob("*")):
                os.chmod(path, folder if path.is_dir() else file)
                if owner is not None and owner.dropped:
                    os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
        return dest

    def withdraw(self, name: str) -> None:
        """Remove what :meth:`provide` copied under ``name`` (nothing if it is not there)."""
        dest = self.data_dir / name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()

    @classmethod
    def create(cls, identity: WorkerIdentity | None = None) -> Sandbox:
        identity = identity or claim_identity()
        if identity.dropped:
            identity = dataclasses.replace(identity, gid=fresh_gid())
        root = Path(tempfile.mkdtemp(prefix="kvgrade-"))
        box = cls(root=root, identity=identity)
        if identity.warning:
            box.warnings.append(identity.warning)
        copy_worker_scripts(box.worker_dir)
        for name in ("submission", "out", "home", "tmp"):
            (root / name).mkdir(exist_ok=True)
        return box

    def hand_over(self) -> None:
        """Give the worker user the writable folders; the worker scripts stay read-only."""
        os.chmod(self.root, 0o711)
        for path in (self.worker_dir, *self.worker_dir.rglob("*")):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        if not self.identity.dropped:
            return
        for name in ("submission", "out", "home", "tmp"):
            top = self.root / name
            for path in (top, *top.rglob("*")):
                os.chown(path, self.identity.uid, self.identity.gid, follow_symlinks=False)
            top.chmod(0o700)  # no other account (another grading's worker) may look in

    def environment(self, device: str, threads: int, trusted: bool = False) -> dict[str, str]:
        """The worker's whole environment: of the parent's, only ``PASSED_FROM_GRADER``. A
        ``trusted`` worker's ``HOME``, ``TMPDIR`` and caches are its own
        (:meth:`trusted_folders`), never the submission's; every other variable is the same."""
        root = self.trusted_folders() if trusted else self.root
        return worker_environment(root, device, threads)

    def cleanup(self) -> None:
        """Remove the sandbox and whatever the worker user left in the shared temp folders."""
        remove_tree(self.root)
        if self.identity.dropped:
            remove_stray_files(self.identity.uid)
            remove_ipc_objects(self.identity.uid)  # where it had no IPC namespace
        if self.identity.lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.identity.lock_fd)  # the account is free for the next grading


def remove_tree(path: Path) -> None:
    """Remove a folder the worker wrote, however deep (Python's rmtree recurses and
    fails on a chain of a thousand folders; GNU ``rm`` does not)."""
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False)


def remove_stray_files(uid: int, places: tuple[Path, ...] = SHARED_TEMP) -> list[Path]:
    """Remove the entries of ``places`` owned by ``uid`` (the worker user); return them."""
    removed = []
    for place in places:
        with contextlib.suppress(OSError):
            for entry in os.scandir(place):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_uid != uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        remove_tree(Path(entry.path))
                    else:
                        os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def warn_once(message: str) -> None:
    """Tell the person running the grader (stderr), never the student."""
    warnings.warn(message, RuntimeWarning, stacklevel=2)
