"""The sandbox tests' shared fixture: a sandbox holding two worker scripts, a probe that
reports what the process it runs in looks like and one that exits as it is told."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grader.sandbox.sandbox import Sandbox

#: Reports what the process it runs in looks like, as JSON on its ``--out-fd``.
PROBE = r"""
import ctypes, json, os, resource, signal, sys, tempfile

args = sys.argv[1:]
in_fd, out_fd = int(args[args.index("--in-fd") + 1]), int(args[args.index("--out-fd") + 1])
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
fds = [f for f in fds if os.path.exists(f"/proc/self/fd/{f}")]  # not the listing's own
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
mask = os.umask(0); os.umask(mask)
facts = {
    "name": __name__,
    "argv": [a for a in args if a not in (str(in_fd), str(out_fd))],
    "path0": sys.path[0],
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "session_leader": os.getsid(0) == os.getpid(),
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "tempdir": tempfile.gettempdir(),
    "other_fds": [f for f in fds if f not in (0, 1, 2, in_fd, out_fd)],
    "stdin": os.readlink("/proc/self/fd/0"),
    "stdout_is_stderr": os.readlink("/proc/self/fd/1") == os.readlink("/proc/self/fd/2"),
    "limits": {n: resource.getrlimit(getattr(resource, n)) for n in
               ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_CPU", "RLIMIT_CORE",
                "RLIMIT_NPROC")},
    "net": os.readlink("/proc/self/ns/net"), "mnt": os.readlink("/proc/self/ns/mnt"),
    "no_new_privs": status["NoNewPrivs"].strip(),
    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    "umask": mask,
    "grader_modules": sorted(m for m in sys.modules if m.split(".")[0] == "grader"),
    "sigchld_default": signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL,
    "sigint_python": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "unbuffered": sys.stdout.write_through,
}
os.write(out_fd, json.dumps(facts).encode())
print("to stdout"); print("to stderr", file=sys.stderr)
"""


#: Exits with the status it is given, or sleeps until it is killed.
EXIT = """import sys, time
if sys.argv[-1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[-1]))
"""


@pytest.fixture
def box() -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    (sandbox.worker_dir / "probe.py").write_text(PROBE)
    (sandbox.worker_dir / "exit.py").write_text(EXIT)
    sandbox.hand_over()
    yield sandbox
    sandbox.cleanup()
