"""The worker runs as an unprivileged user with limits, and sees none of the parent's env."""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from grader.core.paths import GRADESCOPE_FILES, WORKER_ACCOUNTS_SCRIPT
from grader.sandbox.confine import confine
from grader.sandbox.identity import claim_identity
from grader.sandbox.sandbox import (
    Limits,
    Sandbox,
    WorkerIdentity,
    confinement,
    resolve_identity,
    trusted_identity,
)
from tests.conftest import in_param_count, refused

ROOT_ONLY = os.geteuid() == 0


def test_a_trusted_workers_home_and_temporary_folder_are_its_own() -> None:
    """The reference's ``HOME``, ``TMPDIR`` and ``MPLCONFIGDIR`` (its caches) lie in a
    folder of its own, owner-only, outside every folder the submission's worker writes;
    every other variable is the worker's."""
    box = Sandbox.create()
    try:
        box.hand_over()
        worker, trusted = box.environment("cpu", 1), box.environment("cpu", 1, trusted=True)
        assert worker.keys() == trusted.keys()
        assert {k for k in worker if worker[k] != trusted[k]} == {"HOME", "TMPDIR", "MPLCONFIGDIR"}
        own = box.trusted_dir
        for name in ("HOME", "TMPDIR", "MPLCONFIGDIR"):
            path = Path(trusted[name])
            assert path.is_dir() and path.is_relative_to(own)
            assert not any(path.is_relative_to(box.root / n) for n in ("home", "tmp", "out"))
        info = own.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        assert info.st_uid == box.trusted_identity().uid
        if box.identity.dropped:  # a root grader: an account other than the worker's
            assert box.trusted_identity().uid != box.identity.uid
            assert box.trusted_identity().gid != box.identity.gid  # a run gid of its own
    finally:
        box.cleanup()


def test_the_reference_copy_belongs_to_the_trusted_account(tmp_path: Path) -> None:
    source = tmp_path / "reference"
    (source / "llama").mkdir(parents=True)
    (source / "question1.py").write_text("x = 1\n")
    (source / "llama" / "model.py").write_text("y = 2\n")
    box = Sandbox.create()
    try:
        dest = box.provide(source, "reference", private=True)
        owner = box.trusted_identity()
        for path in (dest, dest / "llama", dest / "question1.py", dest / "llama" / "model.py"):
            info = path.stat()
            assert info.st_uid == (owner.uid if owner.dropped else os.getuid())
            assert stat.S_IMODE(info.st_mode) & 0o077 == 0  # no other account reads it
    finally:
        box.cleanup()


@pytest.mark.needs_root(reason="the account pool is used by a root grader only")
def test_without_the_trusted_account_the_reference_keeps_roots_account() -> None:
    """A machine where the set-up did not create it: root, with its folders still its own
    (see the test above); never the worker account."""
    found = trusted_identity(resolve_identity(), name="kvgrader-absent-ref")
    assert (found.uid, found.dropped) == (0, False)


@pytest.mark.needs_root(reason="the account pool is used by a root grader only")
def test_a_reference_run_as_root_is_named_in_the_runs_warnings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from grader.sandbox import sandbox as sandbox_module

    absent = functools.partial(trusted_identity, name="kvgrader-absent-ref")
    monkeypatch.setattr(sandbox_module, "trusted_identity", absent)
    box = Sandbox.create()
    try:
        assert not box.trusted_identity().dropped
        (warning,) = [w for w in box.warnings if "reference" in w]
        assert "runs as 'root'" in warning and "create_worker_user.sh kvgrader 8" in warning
        box.trusted_identity()
        assert len([w for w in box.warnings if "reference" in w]) == 1  # said once
    finally:
        box.cleanup()


def test_a_grader_that_is_not_root_runs_the_reference_as_itself() -> None:
    me = WorkerIdentity(os.getuid(), os.getgid(), "me", dropped=False, warning="w", lock_fd=7)
    found = trusted_identity(me)
    assert (found.uid, found.gid, found.dropped, found.lock_fd) == (me.uid, me.gid, False, -1)


def test_environment_is_built_from_scratch(monkeypatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    box = Sandbox.create()
    try:
        env = box.environment("cpu", 2)
        assert "SECRET_TOKEN" not in env
        assert env["HOME"].startswith(str(box.root))
        assert env["OMP_NUM_THREADS"] == "2"
        assert env["HF_HUB_OFFLINE"] == "1"
    finally:
        box.cleanup()


def test_the_gpu_selection_of_the_grader_goes_through(monkeypatch) -> None:
    # A Slurm task on a node of several GPUs is told its own in CUDA_VISIBLE_DEVICES; a
    # worker without it would run on the node's first GPU, beside every other grading.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    box = Sandbox.create()
    try:
        env = box.environment("cuda", 2)
        assert env["CUDA_VISIBLE_DEVICES"] == "3"
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        assert "CUDA_DEVICE_ORDER" not in env  # only what the grader has
    finally:
        box.cleanup()


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_root_grader_drops_to_an_unprivileged_worker() -> None:
    identity = resolve_identity()
    assert identity.dropped
    assert identity.uid != 0


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_whether_an_account_can_run_the_interpreter_is_asked_once(monkeypatch) -> None:
    from grader.sandbox import identity as module

    started: list[list[str]] = []
    real_run = subprocess.run

    def counting(cmd, *args, **kwargs):
        started.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(module.subprocess, "run", counting)
    module._interpreter_usable_by.cache_clear()
    first, second = resolve_identity(), resolve_identity()
    assert first == second and first.dropped
    assert len(started) == 1  # the second grading asked no interpreter


def test_the_account_check_fails_where_the_interpreter_cannot_find_its_packages() -> None:
    """What the worker account runs to show it can use this interpreter: it succeeds with
    the packages in reach and fails without them (``-S``: no site-packages at all, as
    where the account cannot read them)."""
    from grader.sandbox.identity import FINDS_PACKAGES

    def code(*flags: str) -> int:
        return subprocess.run([sys.executable, "-E", "-s", *flags, "-c", FINDS_PACKAGES]).returncode

    assert code() == 0
    assert code("-S") != 0


@pytest.mark.skipif(ROOT_ONLY, reason="only meaningful when not root")
def test_non_root_grader_warns_that_it_cannot_drop() -> None:
    identity = resolve_identity()
    assert not identity.dropped
    assert "not running as root" in identity.warning


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_worker_cannot_read_root_only_files(grade_patched, tmp_path: Path) -> None:
    secret = tmp_path / "hidden.json"
    secret.write_text("42")
    secret.chmod(0o600)
    graded = grade_patched([in_param_count(f"    open({str(secret)!r}).read()")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_worker_cannot_write_the_results_folder(grade_patched, tmp_path: Path) -> None:
    target = tmp_path / "out" / "results.json"
    graded = grade_patched([in_param_count(f"    open({str(target)!r}, 'w').write('{{}}')")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))
    assert graded.data["tests"]  # the real file, not the forged one


@pytest.mark.needs_root(reason="creating a user needs root")
def test_setup_script_creates_the_worker_user_that_the_grader_then_uses() -> None:
    import pwd
    import subprocess

    name = "kvgrader-selftest"
    script = WORKER_ACCOUNTS_SCRIPT
    try:
        subprocess.run(["bash", str(script), name], check=True, capture_output=True)
        subprocess.run(["bash", str(script), name], check=True, capture_output=True)  # idempotent
        entry = pwd.getpwnam(name)
        identity = resolve_identity(preferred=name)
        assert identity.dropped
        assert (identity.name, identity.uid) == (name, entry.pw_uid)
        assert identity.warning == ""
        # and the reference's own account beside the pool, which trusted workers then use
        trusted = trusted_identity(identity, name=f"{name}-ref")
        assert trusted.dropped and trusted.uid == pwd.getpwnam(f"{name}-ref").pw_uid
        assert trusted.uid != identity.uid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["userdel", f"{name}-ref"], capture_output=True)


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_worker_cannot_read_the_hidden_test_cases(grade_patched) -> None:
    from grader.core.paths import TEST_CASES

    hidden = TEST_CASES / "hidden" / "part1.json"
    graded = grade_patched([in_param_count(f"    open({str(hidden)!r}).read()")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))
    assert 0 < graded.score("1.12") < 2  # the hidden checks still ran, from the parent


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_gradings_side_by_side_get_their_own_worker_account(tmp_path: Path) -> None:
    """Two sandboxes at once never share a user; a finished one frees its account."""
    from grader.sandbox.sandbox import LOCK_DIR, POOL_SIZE, pool_names

    script = WORKER_ACCOUNTS_SCRIPT
    subprocess.run(
        ["bash", str(script), "kvgrader", str(POOL_SIZE)], check=True, capture_output=True
    )
    first, second = Sandbox.create(), Sandbox.create()
    try:
        assert first.identity.dropped and second.identity.dropped
        assert first.identity.uid != second.identity.uid
        assert {first.identity.name, second.identity.name} <= set(pool_names())
        second.hand_over()
        assert (second.submission_dir.stat().st_mode & 0o077) == 0  # no one else looks in
    finally:
        name = first.identity.name
        first.cleanup()
        second.cleanup()
    # Released by cleanup. Other test workers grade side by side and may take the freed
    # account at once, so ask the kernel who holds the lock rather than taking it here.
    assert os.getpid() not in _flock_holders(LOCK_DIR / f"{name}.lock")
    setup = (GRADESCOPE_FILES / "setup.sh").read_text()
    assert f'create_worker_user.sh" kvgrader {POOL_SIZE}' in setup


def _flock_holders(path: Path) -> set[int]:
    """The processes holding a ``flock`` on ``path``, from ``/proc/locks``."""
    info = path.stat()
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if fields[1] == "FLOCK" and fields[5] == inode:
            holders.add(int(fields[4]))
    return holders


def _limits_of_worker(device: str) -> dict[str, str]:
    """The soft limits a worker started for ``device`` runs under, from /proc."""
    spec = confinement(Limits(), resolve_identity(), device=device)
    proc = subprocess.run(
        ["cat", "/proc/self/limits"],
        preexec_fn=lambda: confine(spec),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows = {}
    for line in proc.stdout.splitlines()[1:]:
        name, soft = line[:26].strip(), line[26:47].strip()
        rows[name] = soft
    return rows


@pytest.mark.parametrize(
    ("device", "bounded", "free"),
    [("cpu", "Max address space", "Max data size"), ("cuda", "Max data size", "Max address space")],
)
def test_worker_memory_is_bounded_by_a_limit_cuda_can_start_under(
    device: str, bounded: str, free: str
) -> None:
    """CUDA reserves about 18 GB of address space when it starts (measured on an H100:
    VmSize 17.9 GB, VmData 1.4 GB) and fails under a 6 GiB RLIMIT_AS, so a GPU worker's
    memory is bounded by its data segment instead; a CPU worker keeps the stricter
    address-space limit."""
    limits = _limits_of_worker(device)
    assert limits[bounded] == str(Limits().memory_bytes)
    assert limits[free] != str(Limits().memory_bytes)


def test_a_data_limited_worker_cannot_allocate_past_its_limit() -> None:
    """RLIMIT_DATA bounds host memory as RLIMIT_AS did: a 1 GiB anonymous mapping fails
    under a 256 MiB data limit."""
    code = (
        "import mmap\n"
        "try:\n    mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE)\n"
        "except OSError:\n    print('refused')"
    )
    spec = confinement(Limits(memory_bytes=256 * 1024 * 1024), resolve_identity(), device="cuda")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: confine(spec),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == "refused", proc.stderr


@pytest.mark.needs_root(reason="the account pool is used by a root grader only")
def test_without_a_pool_the_warning_names_the_fallback_not_a_busy_pool() -> None:
    """A machine without the pool's accounts (a GPU node where setup.sh never ran) is
    told which account runs the worker, not that every account is in use."""
    identity = claim_identity("kvgrader-absent", size=2)
    assert "does not exist" in identity.warning
    assert "create_worker_user.sh kvgrader-absent 8" in identity.warning  # what to run
    assert "in use" not in identity.warning


@pytest.mark.needs_root(reason="the account pool is used by a root grader only")
def test_accounts_that_cannot_run_python_are_named_not_called_busy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root with a python the pool's accounts cannot read (a venv under /root): the
    warning says so, not that every account is in use (they are free)."""
    import pwd

    from grader.sandbox import identity as ids

    monkeypatch.setattr(ids, "LOCK_DIR", tmp_path / "locks")
    monkeypatch.setattr(ids, "_interpreter_usable_by", lambda uid, gid: False)
    name = "nobody"  # an account that exists everywhere, and is not the grader's own
    pwd.getpwnam(name)
    monkeypatch.setattr(ids, "pool_names", lambda preferred, size: [name])
    identity = claim_identity(name, size=1)
    assert f"({name}) cannot run" in identity.warning
    assert "in use" not in identity.warning


def test_without_prctl_only_a_root_grader_refuses_to_start_a_worker(monkeypatch) -> None:
    """macOS has no prctl: a student's self-check (not root) still starts its worker; a
    root grader there would not run student code without the privilege lock."""
    import ctypes
    import errno

    from grader.sandbox import confine as confine_module

    class NoPrctl:  # a C library without prctl, as macOS's
        def __init__(self, *args, **kwargs) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoPrctl)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert confine_module.no_new_privileges() == 0
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert confine_module.no_new_privileges() == errno.ENOSYS


@pytest.mark.needs_root(reason="dropping privileges needs root")
def test_the_reference_copy_is_out_of_the_worker_accounts_reach() -> None:
    """The yardstick's copy of the reference is the grader's alone for its whole life: the
    worker account cannot list or read it, while a public copy stays readable."""
    from grader.core.paths import SOLUTION

    box = Sandbox.create()
    try:
        box.hand_over()
        private = box.provide(SOLUTION / "llama", "reference", private=True)
        public = box.provide(SOLUTION / "llama", "public")
        assert all(p.stat().st_mode & 0o077 == 0 for p in (private, *private.rglob("*")))
        as_worker = dict(user=box.identity.uid, group=box.identity.gid, extra_groups=[])
        probe = "import sys; print(open(sys.argv[1]).read()[:10])"
        for folder, readable in ((private, False), (public, True)):
            run = subprocess.run(
                [sys.executable, "-c", probe, str(folder / "model.py")],
                capture_output=True,
                timeout=60,
                cwd="/",
                **as_worker,
            )
            assert (run.returncode == 0) is readable, run.stderr
    finally:
        box.cleanup()


def test_every_worker_keeps_freed_heap_blocks_unless_the_ta_sets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from grader.sandbox.sandbox import MALLOC_SETTINGS, worker_environment

    for name in MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    for device in ("cpu", "cuda"):
        env = worker_environment(None, device, 1)
        assert {name: env.get(name) for name in MALLOC_SETTINGS} == MALLOC_SETTINGS, device
    assert int(MALLOC_SETTINGS["MALLOC_TRIM_THRESHOLD_"]) > 0  # so "0" below is the TA's
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")  # the TA's choice
    env = worker_environment(None, "cpu", 1)
    assert env["MALLOC_TRIM_THRESHOLD_"] == "0"
    assert env["MALLOC_MMAP_THRESHOLD_"] == MALLOC_SETTINGS["MALLOC_MMAP_THRESHOLD_"]


def test_a_gpu_worker_gets_growing_allocator_segments_unless_the_ta_sets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from grader.sandbox.sandbox import worker_environment

    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    assert worker_environment(None, "cuda", 1)["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:True"
    )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_environment(None, "cpu", 1)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")  # the TA's choice
    env = worker_environment(None, "cuda", 1)
    assert env["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:128"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
