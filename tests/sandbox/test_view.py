"""The worker's view of the files (grader/sandbox/visible.py, mounts.py, landlock.py,
view.py): what it lists, and what a worker sees with a tree of its own and with Landlock
alone, forked by the fork server or started as a new interpreter alike."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader.core.paths import PROJECT_ROOT
from grader.sandbox import landlock, visible
from grader.sandbox.confine import Confinement
from grader.sandbox.forkserver import ForkServer, start_interpreter
from grader.sandbox.identity import WorkerIdentity
from grader.sandbox.landlock import LandlockRules, abi_version, restrict, rules_for
from grader.sandbox.mounts import mount_isolation, plan_for
from grader.sandbox.sandbox import Limits, Sandbox, confinement, network_isolation
from grader.sandbox.view import (
    LANDLOCK,
    MOUNT_NAMESPACE,
    NONE,
    VIEW_ENV,
    WorkerView,
    with_view,
    worker_view,
)

pytestmark = pytest.mark.usefixtures("own_fork_servers")


def view_available(kind: str) -> bool:
    """Whether this machine gives a worker account ``kind`` (a root grader only)."""
    if os.geteuid() != 0:
        return False
    return not mount_isolation() if kind == MOUNT_NAMESPACE else abi_version() >= 1


VIEWS = [
    pytest.param(
        kind,
        marks=pytest.mark.skipif(not view_available(kind), reason=f"no {kind} view here"),
    )
    for kind in (MOUNT_NAMESPACE, LANDLOCK)
]


# ------------------------------------------------------------------ what is listed


def test_a_checkout_inside_a_shown_folder_is_covered_and_its_venv_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "usr"
    (system / "src").mkdir(parents=True)
    (system / "local" / "kit" / ".venv").mkdir(parents=True)
    monkeypatch.setattr(visible, "SYSTEM", (str(system),))
    monkeypatch.setattr(visible, "SOURCE_FOLDERS", (str(system / "src"),))
    kit, box = system / "local" / "kit", tmp_path / "box"
    seen = visible.visible(str(box), [str(kit)], [str(kit / ".venv"), str(system)])
    assert seen.read_only[0] == str(system)
    assert str(kit / ".venv") in seen.read_only  # shown again inside its covered checkout
    assert str(system) not in seen.read_only[1:]  # already shown: not bound twice
    assert set(seen.hidden) == {str(kit), str(system / "src")}
    assert seen.writable == (str(box),)


def test_folders_outside_the_shown_ones_are_neither_covered_nor_shown(tmp_path: Path) -> None:
    """A checkout under /tmp or /srv is simply absent; its venv, the interpreter, is bound."""
    checkout = tmp_path / "checkout"
    (checkout / ".venv").mkdir(parents=True)
    seen = visible.visible(str(tmp_path / "box"), [str(checkout)], [str(checkout / ".venv")])
    assert str(checkout) not in seen.hidden
    assert str(checkout / ".venv") in seen.read_only
    assert not [p for p in seen.read_only if p.startswith("/home") or p == str(checkout)]
    assert all(p.startswith("/etc/") for p in seen.read_only if "etc" in p)


def test_landlock_shows_a_covered_folders_neighbours_one_by_one(tmp_path: Path) -> None:
    top = tmp_path / "usr"
    for name in ("bin", "lib", "src/kit/.git", "local/src", "local/share"):
        (top / name).mkdir(parents=True)
    (top / "outside").symlink_to("/home")  # a link is never a way out
    hidden = (str(top / "src"), str(top / "local" / "src"))
    shown = landlock._shown_apart(str(top), hidden)
    assert sorted(shown) == sorted(str(top / n) for n in ("bin", "lib", "local/share"))
    assert landlock._shown_apart(str(top / "bin"), hidden) == [str(top / "bin")]
    assert landlock._shown_apart(str(top / "src"), hidden) == []


def test_landlock_rules_give_reading_writing_and_devices_apart(tmp_path: Path) -> None:
    seen = visible.Visible(
        read_only=("/usr", "/etc/passwd"),
        links=(("/bin", "usr/bin"),),
        hidden=(),
        writable=(str(tmp_path),),
        devices=("/dev/null",),
    )
    rules = rules_for(seen)
    assert {"/usr", "/etc/passwd", "/proc", "/sys"} <= set(rules.read)
    assert rules.write == (str(tmp_path),) and rules.devices == ("/dev/null",)
    assert not any(p in ("/", "/home", "/tmp", "/run") for p in rules.read)


def test_every_right_of_each_landlock_abi_is_handled() -> None:
    assert landlock.handled_rights(0) == 0
    assert landlock.handled_rights(1) == (1 << 13) - 1
    assert landlock.handled_rights(4) == landlock.handled_rights(3)
    assert landlock.handled_rights(7) & landlock.IOCTL_DEV
    assert not landlock.handled_rights(2) & landlock.TRUNCATE


def test_a_confinement_with_either_view_survives_the_fork_servers_json(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, [PROJECT_ROOT], [tmp_path / "venv"])
    rules = LandlockRules(read=("/usr",), write=(str(tmp_path),), devices=("/dev/null",))
    with_tree = confinement(Limits(), _identity(), mounts=plan)
    with_rules = dataclasses.replace(confinement(Limits(), _identity()), landlock=rules)
    for spec in (with_tree, with_rules):
        again = Confinement.from_json(json.loads(json.dumps(spec.to_json())))
        assert again == spec


def _identity() -> WorkerIdentity:
    return WorkerIdentity(name="w", uid=12345, gid=12345, dropped=True)


# ------------------------------------------------------------------- which view


def test_a_lesser_view_is_given_when_asked_and_a_none_view_warns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(VIEW_ENV, "none")
    view = worker_view()
    assert view.kind == NONE and VIEW_ENV in view.reason
    assert "sees the machine's files" in view.warning
    monkeypatch.setenv(VIEW_ENV, "landlock")
    expected = LANDLOCK if abi_version() >= 1 else NONE
    assert worker_view().kind == expected
    assert WorkerView(LANDLOCK, "no mount namespace").warning == ""
    assert WorkerView(LANDLOCK).closes_tcp == (abi_version() >= 4)
    assert not WorkerView(MOUNT_NAMESPACE).closes_tcp and not WorkerView(NONE).closes_tcp


def test_a_grader_that_is_not_root_gives_no_view_and_keeps_the_spec(tmp_path: Path) -> None:
    assert worker_view(dropped=False).kind == NONE
    own = WorkerIdentity(name="me", uid=os.getuid(), gid=os.getgid(), dropped=False)
    spec = confinement(Limits(), own)
    assert with_view(spec, tmp_path, [PROJECT_ROOT]) is spec


# -------------------------------------------------------- what a worker sees, for real

#: Tries what an attacker would, and reports each attempt ("done" or the error's name).
VIEW_PROBE = r"""
import json, os, sys
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
clone, open_dir, tag = opt("--clone"), opt("--open"), opt("--tag")
import socket
def attempt(act):
    try:
        act()
        return "done"
    except OSError as exc:
        return type(exc).__name__
def write(path):
    with open(path, "wb") as f:
        f.write(b"x" * 65536)
try:  # before anything is written: the folder two above the worker's own
    above = sorted(os.listdir("../.."))
except OSError as exc:
    above = type(exc).__name__
facts = {
    "above_cwd": above,
    "clone_git": attempt(lambda: open(os.path.join(clone, ".git", "HEAD")).read()),
    "clone_listed": attempt(lambda: os.listdir(clone)),
    "run_lock": attempt(lambda: write(f"/run/lock/kvgrader-{tag}")),
    "open_folder": attempt(lambda: write(os.path.join(open_dir, f"fill-{tag}"))),
    "tmp": attempt(lambda: write(f"/tmp/kvgrader-{tag}")),
    "home": attempt(lambda: os.listdir("/home")),
    "tcp": attempt(lambda: socket.create_connection(("127.0.0.1", int(opt("--port"))), 5)),
    "sandbox": attempt(lambda: write(os.path.join(os.environ["TMPDIR"], "scratch"))),
    "torch_less_import": attempt(lambda: __import__("email.mime.text")),
}
os.write(int(opt("--out-fd")), json.dumps(facts).encode())
"""


@pytest.fixture
def elsewhere() -> Iterator[tuple[Path, Path]]:
    """Another checkout of the kit on this machine, readable by everyone (a TA's second
    clone), and a folder anyone may write (as ``/run/lock`` is), both under /srv."""
    base = Path(tempfile.mkdtemp(prefix="kvgrader-host-", dir="/srv"))
    clone, open_dir = base / "clone", base / "open"
    (clone / ".git").mkdir(parents=True)
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    open_dir.mkdir()
    for path in (base, *base.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    open_dir.chmod(0o1777)
    with socket.create_server(("127.0.0.1", 0)) as listener:  # a service on the machine
        yield clone, open_dir, listener
    shutil.rmtree(base)


def _see(box: Sandbox, spec: Confinement, server: ForkServer | None, paths, tag: str) -> dict:
    """What ``VIEW_PROBE`` reports, forked by ``server`` or started (``server`` None);
    ``paths``: the other checkout, the world-writable folder and a listening socket."""
    clone, open_dir, listener = paths
    port = str(listener.getsockname()[1])
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    probe = str(box.worker_dir / "view_probe.py")
    names = ["--clone", str(clone), "--open", str(open_dir), "--tag", tag, "--port", port]
    launch = {"env": box.environment("cpu", 1), "cwd": str(box.submission_dir)}
    try:
        if server is None:
            argv = [probe, "--in-fd", str(req_r), "--out-fd", str(resp_w), *names]
            proc = start_interpreter(argv, confinement=spec, pass_fds=(req_r, resp_w), **launch)
        else:
            argv = [probe, "--in-fd", "{in_fd}", "--out-fd", "{out_fd}", *names]
            proc = server.spawn(argv=argv, confinement=spec, pass_fds=(req_r, resp_w), **launch)
    finally:
        os.close(req_r)
        os.close(resp_w)
    code = proc.wait(timeout=60)
    output = proc.stdout.read()
    proc.stdout.close()
    assert code == 0, output
    facts = json.loads(os.read(resp_r, 1 << 20))
    for fd in (req_w, resp_r):
        os.close(fd)
    return facts


@pytest.mark.parametrize("kind", VIEWS)
def test_the_worker_sees_no_other_checkout_and_writes_no_host_folder(
    box: Sandbox, elsewhere, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VIEW_ENV, kind)
    (box.worker_dir / "view_probe.py").write_text(VIEW_PROBE)
    (box.worker_dir / "view_probe.py").chmod(0o644)
    neighbour = Path(tempfile.mkdtemp(prefix="kvgrade-neighbour-"))  # another grading
    neighbour.chmod(0o755)
    offline = not network_isolation()  # a namespace where one can be made, as a grading's
    spec = with_view(confinement(Limits(), box.identity, offline), box.root, [PROJECT_ROOT])
    assert (spec.mounts is not None, spec.landlock is not None) == (
        kind == MOUNT_NAMESPACE,
        kind == LANDLOCK,
    )
    server = ForkServer(("json",), {**box.environment("cpu", 1), "HOME": "/nonexistent"})
    server.start(timeout=60)
    try:
        forked = _see(box, spec, server, elsewhere, "forked")
        started = _see(box, spec, None, elsewhere, "started")
    finally:
        server.close()
        shutil.rmtree(neighbour)
    assert forked == started  # the same view either way
    for attempt in ("clone_git", "clone_listed", "run_lock", "open_folder", "home", "tcp"):
        assert forked[attempt] != "done", attempt
    assert forked["sandbox"] == forked["torch_less_import"] == "done"
    assert neighbour.name not in str(forked["above_cwd"])  # no way round through '..'
    if kind == MOUNT_NAMESPACE:  # /tmp is a private tmpfs, gone with the worker
        assert forked["tmp"] == "done"
        assert forked["above_cwd"] == [box.root.name]
    else:
        assert forked["tmp"] != "done" and forked["above_cwd"] == "PermissionError"
    for tag in ("forked", "started"):
        assert not Path(f"/run/lock/kvgrader-{tag}").exists()
        assert not Path(f"/tmp/kvgrader-{tag}").exists()
    assert os.listdir(elsewhere[1]) == []
    if spec.landlock is not None:  # no network namespace: Landlock closes TCP instead
        assert spec.landlock.close_tcp == (not spec.isolate_network)


@pytest.mark.skipif(not view_available(MOUNT_NAMESPACE), reason="no mount namespace here")
def test_the_workers_tree_holds_only_what_is_listed(box: Sandbox) -> None:
    """The new root's top level, /etc and /dev, as the worker account lists them."""
    script = (
        "import json, os, shutil, subprocess\n"
        "seen = {p: sorted(os.listdir(p)) for p in ('/', '/etc', '/dev')}\n"
        "fc = shutil.which('fc-list')\n"  # matplotlib asks it for the fonts
        "listed = subprocess.run([fc], capture_output=True, text=True) if fc else None\n"
        "seen['fc-list'] = listed.stderr if listed else ''\n"
        "print(json.dumps(seen))"
    )
    spec = with_view(confinement(Limits(), box.identity), box.root, [PROJECT_ROOT])
    proc = subprocess.run(
        ["/usr/bin/env", "python3", "-c", script],
        capture_output=True,
        text=True,
        cwd=box.submission_dir,
        env=box.environment("cpu", 1),
        preexec_fn=lambda: _confine(spec),
        timeout=60,
        check=True,
    )
    seen = json.loads(proc.stdout)
    top = {"usr", "bin", "sbin", "lib", "lib64", "etc", "proc", "sys", "dev", "tmp", "var", "run"}
    assert set(seen["/"]) - top <= {PROJECT_ROOT.parts[1], "lib32", "libx32"}
    assert not {"home", "root", "srv", "mnt", "opt", "media"} & set(seen["/"])
    assert set(seen["/etc"]) <= set(visible.ETC) and "passwd" in seen["/etc"]
    assert "shadow" not in seen["/etc"]
    assert {"null", "zero", "urandom", "shm", "fd"} <= set(seen["/dev"])
    assert not [d for d in seen["/dev"] if d.startswith(("tty", "vd", "sd", "loop", "kmsg"))]
    assert seen["fc-list"] == ""  # no "Fontconfig error: Cannot load default config file"


def _confine(spec: Confinement) -> None:
    from grader.sandbox.confine import confine

    confine(spec)


def _in_own_tree(prepare, plan_of, look) -> dict:
    """In a forked child: ``prepare()`` in a mount namespace of the child's own (mounts
    the host must not get), the tree of ``plan_of()``, then what ``look()`` reports."""
    from grader.sandbox.mounts import CLONE_NEWNS, MS_PRIVATE, MS_REC, _libc, _mount, apply

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            assert _libc().unshare(CLONE_NEWNS) == 0
            _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
            prepare()
            apply(plan_of())
            seen = look()
        except BaseException as exc:
            seen = {"error": repr(exc)}
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        seen = json.loads(f.read())
    os.waitpid(pid, 0)
    return seen


@pytest.mark.skipif(not view_available(MOUNT_NAMESPACE), reason="no mount namespace here")
def test_mounts_inside_a_shown_folder_are_shown_read_only_and_a_covered_one_is_empty(
    tmp_path: Path,
) -> None:
    """A container's GPU driver libraries are mounts of their own inside /usr: they must
    come along, read-only like the rest; a checkout inside a shown folder is covered,
    its venv shown again."""
    from grader.sandbox.mounts import MountPlan, _mount

    shown, box = tmp_path / "shown", tmp_path / "kvgrade-box"
    for folder in (shown / "driver", shown / "kit" / ".venv", box):
        folder.mkdir(parents=True)
    (shown / "kit" / ".git").write_text("history")
    (shown / "kit" / ".venv" / "marker").write_text("venv")

    def prepare() -> None:
        _mount("tmpfs", str(shown / "driver"), "tmpfs", 0, "size=1m")
        (shown / "driver" / "libcuda.so").write_text("driver")

    def plan() -> MountPlan:
        kit = shown / "kit"
        read_only = (str(shown), str(kit / ".venv"))
        return MountPlan(read_only, (), (str(kit),), (str(box),), ())

    def look() -> dict:
        try:
            (shown / "driver" / "new").write_text("x")
            written = "done"
        except OSError as exc:
            written = exc.strerror
        return {
            "driver": (shown / "driver" / "libcuda.so").read_text(),
            "written": written,
            "kit": sorted(os.listdir(shown / "kit")),
            "venv": (shown / "kit" / ".venv" / "marker").read_text(),
            "box": os.access(box, os.W_OK),
        }

    seen = _in_own_tree(prepare, plan, look)
    assert seen == {
        "driver": "driver",
        "written": "Read-only file system",
        "kit": [".venv"],
        "venv": "venv",
        "box": True,
    }


@pytest.mark.skipif(abi_version() < 4, reason="no Landlock network rights here")
@pytest.mark.parametrize("close_tcp", [True, False])
def test_landlock_closes_tcp_where_asked(close_tcp: bool) -> None:
    """Where the worker has no network namespace (a default Docker container), Landlock
    refuses it every TCP connection, to this machine's own services too."""
    from grader.sandbox.confine import no_new_privileges

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                assert no_new_privileges() == 0
                restrict(LandlockRules(read=(), write=(), devices=(), close_tcp=close_tcp))
                with socket.socket() as client:  # nothing left to import: files are shut
                    client.settimeout(5)
                    client.connect(("127.0.0.1", port))
                outcome = 0
            except OSError as exc:
                outcome = exc.errno or -1
            except BaseException:
                outcome = -2
            os.write(w, str(outcome).encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            outcome = int(f.read())
        os.waitpid(pid, 0)
    assert outcome == (errno.EACCES if close_tcp else 0)
