"""Grading one submission of an export in a child process, contained: the grader's own
process group under a wall-clock timeout, its sandbox folder swept afterwards, and a valid
results file whatever happens (a fallback that says why). Both executors call
:func:`grade_one`: the local one in threads (:mod:`grader.ta.regrade.batch`), the cluster
one in each array task (:mod:`grader.ta.regrade.cluster`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grader.core.paths import PROJECT_ROOT
from grader.core.points import part_total
from grader.core.results import fallback_results, validate_results, write_results
from grader.core.thresholds import DEVICES, resolve_device
from grader.sandbox import cpu_share
from grader.sandbox.cpu_share import GradingGroup
from grader.sandbox.identity import RUN_RECORD_ENV
from grader.sandbox.processes import kill_matching, kill_tree
from grader.sandbox.shared import Offer, SharedForkServer, handing


def load_valid(path: Path) -> dict[str, Any] | None:
    """The results file at ``path`` if it exists and is valid Gradescope JSON, else None."""
    try:
        data = json.loads(path.read_text())
        validate_results(data)
    except Exception:
        return None
    return data


#: Graders running now, and whether the batch is being interrupted: on Ctrl-C every
#: running grader is killed and writes nothing, so a re-run grades it again.
#: Running graders, their sandbox folders and the fork server offered to each.
_live: dict[subprocess.Popen, tuple[Path, Offer | None]] = {}
_stopping = threading.Event()


def _kill_tree(proc: subprocess.Popen, folder: Path, server: Offer | None = None) -> None:
    """Kill the grader, its workers, the fork ``server`` offered to it (not its child: the
    batch's shared server forked it) with its workers, and anything still running from
    its sandbox ``folder``: a worker forked just as the grader was killed leaves the tree
    before it can be listed."""
    if server is not None and server.alive():  # first: it lives while the grader holds its socket
        kill_tree(server.pid)
    if proc.poll() is None:
        kill_tree(proc.pid)
        proc.wait()
    kill_matching(lambda p: any(str(folder) in a for a in p.info["cmdline"] or []), ["cmdline"])
    record = folder / "identity.json"  # written by the grader: its worker's uid and run gid
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        who = json.loads(record.read_text())
        uid, gid = int(who["uid"]), int(who["gid"])
        if uid != 0:  # processes that left the sandbox (chdir, setsid) keep uid and gid
            kill_matching(
                lambda p: p.info["uids"].real == uid and p.info["gids"].real == gid,
                ["uids", "gids"],
            )


def grade_one(
    submission: Path,
    results: Path,
    *,
    parts: list[str],
    timeout_s: float,
    python: str,
    device: str = "auto",
    tags: str = "",
    shared: SharedForkServer | None = None,
) -> str:
    """Grade one folder in a child process and return its status. Never raises for the
    submission's sake: after a timeout, a crash or an invalid file a fallback results file
    says what happened. If this process is being stopped (Ctrl-C, or a cluster task's
    time-limit signal), the grader and its workers are killed before the exception goes on.
    With ``shared`` (a batch's fork server), the grading is offered a server of its own
    forked from it, the libraries already imported. The grading's processes share one
    CPU weight and process limit (:mod:`grader.sandbox.cpu_share`), so that a grading beside
    it cannot take its CPU."""
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)  # never mistake a stale file for this run's
    cmd = [python, "-m", "grader", "grade", str(submission), "--results", str(results)]
    cmd += ["--hide", str(submission.parent)]  # the export: other students' files and names
    cmd += ["--parts", ",".join(parts), "--device", device] + (["--tags", tags] if tags else [])
    # The grader's sandboxes go in a folder of ours, removed even when the grader is killed;
    # 0o711 lets the unprivileged worker user reach its sandbox inside.
    tmp = Path(tempfile.mkdtemp(prefix="kvbatch-"))
    tmp.chmod(0o711)
    status, reason, stopped = "graded", "", False

    def on_stop() -> None:
        nonlocal stopped
        stopped = True

    grading = cpu_share.create(re.sub(r"[^A-Za-z0-9_.-]", "_", submission.name)[:40])
    try:
        offer = _offered(shared, grading)
        code, status, reason = _run_grader(cmd, results, tmp, timeout_s, on_stop, offer, grading)
        if _stopping.is_set():  # interrupted: no file (the grader reserves one at its
            results.unlink(missing_ok=True)  # start), so that a re-run grades it
            return "error"
        data = load_valid(results) if status == "graded" else None
        if status == "graded" and code is not None and -code == cluster_stop_signal():
            results.unlink(missing_ok=True)  # the task is being stopped: grade it again
            on_stop()
            stop_as_the_cluster_asked(-code)
        if status == "graded" and code is not None and code < 0:
            # The trusted grader itself was killed by a signal that is not our timeout's (a
            # cluster task cancelled or preempted, its node lost, the OOM killer): nothing
            # the submission did, so the file says so and the next run grades it again.
            status = "interrupted"
            reason = (
                f"The grading was interrupted (the grader was killed by "
                f"{signal_name(-code)}), not by this submission; the next regrade runs it again."
            )
        elif status == "graded" and data is None:
            status, reason = "error", f"The grader exited ({code}) without a valid results file."
        elif data and [t.get("name") for t in data["tests"]] == ["Autograder error"]:
            status = "error"  # the grader's own fallback: it failed, and the file says so
    except Exception as exc:
        # The task is being stopped: submitit's time-limit handler raised while this one
        # waited, or after the grader had ended (nothing else here calls submitit).
        if stopped or type(exc).__module__.startswith("submitit."):
            raise
        status, reason = "error", f"The grader could not be run ({type(exc).__name__}: {exc})."
    finally:
        grading.remove()  # and whatever the grading left running in it
        shutil.rmtree(tmp, ignore_errors=True)
    if reason:
        where = resolve_device(device)  # "auto" named as what this machine would have used
        write_fallback(results, parts, reason, device=where, interrupted=status == "interrupted")
    return status


def _offered(shared: SharedForkServer | None, grading: GradingGroup) -> Offer | None:
    """A fork server for the grading from the batch's ``shared`` one, moved into the
    grading's groups before anything is forked from it; None where there is no shared
    server, or it could not be moved (its workers would be born outside the grading's
    share: the grading starts its own servers, inside)."""
    offer = shared.offer() if shared is not None else None
    if offer is not None and not grading.join(offer.pid):
        if offer.alive():
            kill_tree(offer.pid)
            with contextlib.suppress(OSError):
                os.kill(offer.pid, signal.SIGKILL)  # itself, if it leads no group
        offer.handed_over()
        return None
    return offer


def _run_grader(
    cmd: list[str],
    results: Path,
    tmp: Path,
    timeout_s: float,
    on_stop: Callable[[], None],
    offer: Offer | None = None,
    grading: GradingGroup | None = None,
) -> tuple[int | None, str, str]:
    """Run the grader command in its own session with its sandboxes under ``tmp`` (and
    the fork server ``offer``ed to it), inside the ``grading``'s groups; its exit code, and
    ("timeout", why) when it ran past ``timeout_s``. Whatever stops this process while it
    waits kills the grader, its server and its workers first, and ``on_stop`` is told."""
    code: int | None = None
    status, reason = "graded", ""
    grading = grading if grading is not None else GradingGroup()
    env = {**os.environ, "TMPDIR": str(tmp), RUN_RECORD_ENV: str(tmp / "identity.json")}
    env[cpu_share.MODE_ENV] = grading.mode
    with open(results.parent / "grader.log", "wb") as log, handing(offer, env) as handed:
        proc = subprocess.Popen(
            grading.command(cmd),
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **handed,
        )
    _live[proc] = (tmp, offer)
    if _stopping.is_set():  # the batch was interrupted while this one started
        _kill_tree(proc, tmp, offer)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc, tmp, offer)
        status, reason = "timeout", f"The regrade timed out after {timeout_s:g} s."
    except BaseException:  # this process is being stopped: leave nothing running
        _kill_tree(proc, tmp, offer)
        results.unlink(missing_ok=True)  # the grader's placeholder: grade it again
        on_stop()
        raise
    finally:
        _live.pop(proc, None)
    return code, status, reason


def write_fallback(
    results: Path, parts: list[str], reason: str, *, device: str = "", interrupted: bool = False
) -> None:
    """A valid results file that scores 0 out of ``parts``' points and says why, naming the
    device and profile it was to be graded with; ``interrupted`` marks a grading that the
    infrastructure cut short, which the next regrade runs again (``batch.is_done``)."""
    total = sum(part_total(p) for p in parts)
    data = fallback_results(f"{reason} Please tell the course staff.", total)
    data["extra_data"] = {
        "device": device,
        "benchmark_profile": device if device in DEVICES else "",
        "interrupted": interrupted,
    }
    write_results(data, results)


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15, or ``signal 99`` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def cluster_stop_signal() -> int | None:
    """The signal a submitit cluster task gets ahead of its time limit or when it is
    preempted (submitit's ``SUBMITIT_PREEMPT_SIGNAL``, SIGUSR2 by default), when this
    process is such a task in its main thread; else None."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()
    number = getattr(signal, name if name.startswith("SIG") else f"SIG{name}", None)
    return int(number) if number is not None else None


def stop_as_the_cluster_asked(number: int) -> None:
    """The cluster signals every process of a task, one after another. When the grader
    dies of it before this process's own copy arrives, the task's handler runs now (with
    submitit's: the task ends as timed out, or is requeued when preempted), as it would
    have while this process waited; the copy still on its way is the same event and is
    ignored. Always raises."""
    handler = signal.getsignal(number)
    signal.signal(number, signal.SIG_IGN)
    if callable(handler):
        handler(number, None)
    raise InterruptedError(f"the cluster stopped this task ({signal_name(number)})")


def stop_running() -> None:
    """Ctrl-C: no grading starts any more, and every running one is killed (it writes
    nothing, so a re-run grades it again)."""
    _stopping.set()
    for proc, (folder, server) in list(_live.items()):
        _kill_tree(proc, folder, server)


def allow_running() -> None:
    """A new batch may start gradings again."""
    _stopping.clear()
