"""The whole grading's deadline, kept by a thread the submission cannot block, and behind
it by a process that nothing in the grader can block."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from grader.core.results import fallback_results, write_results

#: The backstop: a bare interpreter that waits on a pipe the grader holds open. The pipe
#: closes when the grader ends, however it ends; if the deadline comes first and the
#: grader is still its parent (so never a process that took a dead grader's pid), the
#: backstop writes the results file and kills the grader. It imports nothing of the kit.
BACKSTOP = """
import os, select, sys
fd, grader, seconds, path, text = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), \\
    sys.argv[4], sys.argv[5]
if not select.select([fd], [], [], seconds)[0] and os.getppid() == grader:
    tmp = f"{path}.backstop-{os.getpid()}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(out, text.encode())
    os.close(out)
    os.replace(tmp, path)
    os.kill(grader, 9)  # SIGKILL (the signal module's import alone costs 5 ms)
"""


class Watchdog:
    """The whole grading's deadline, kept by a thread the submission cannot block.

    When it passes, ``on_expire`` stops the run's workers: whatever check is
    waiting on one fails at once, the rest fail fast, and the results are
    written as usual. If the grader still has not finished ``grace_s`` later,
    the thread writes a valid results file itself and ends the process.

    The thread needs Python's lock, which code running in C holds for as long as it
    runs (an expression that backtracks, a parse): ``backstop_s`` after the thread's
    turn, a process of its own writes the same file and kills the grader.
    """

    def __init__(
        self,
        seconds: float,
        on_expire: Callable[[], None],
        results_path: Path,
        max_score: float,
        grace_s: float = 60.0,
        backstop_s: float = 30.0,
    ) -> None:
        self.seconds, self.grace_s, self.backstop_s = seconds, grace_s, backstop_s
        self.on_expire, self.results_path, self.max_score = on_expire, results_path, max_score
        self.done = threading.Event()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._backstop: subprocess.Popen[bytes] | None = None
        self._hold: int | None = None  # the pipe's end the grader holds open

    def start(self) -> None:
        self._timer.start()
        read, self._hold = os.pipe()
        text = json.dumps(fallback_results(self.stopped(), max_score=self.max_score), indent=2)
        with contextlib.suppress(OSError):  # without it the thread still keeps the deadline
            self._backstop = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", BACKSTOP, str(read), str(os.getpid()),
                 str(self.seconds + self.grace_s + self.backstop_s),
                 str(Path(self.results_path).resolve()), text],
                pass_fds=(read,), stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        os.close(read)

    def finish(self) -> None:
        self.done.set()
        self._timer.cancel()
        if self._hold is not None:
            os.close(self._hold)  # the backstop sees the pipe close and ends
            self._hold = None
        if self._backstop is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._backstop.wait(timeout=5)

    def stopped(self) -> str:
        """What the page says when the grading is stopped at its deadline."""
        return (
            f"The grading did not finish within {self.seconds:.0f} s and was stopped. "
            "This is not your fault if your code is quick; please tell the course staff."
        )

    def _expire(self) -> None:
        with contextlib.suppress(Exception):
            self.on_expire()
        if self.done.wait(self.grace_s):
            return
        write_results(fallback_results(self.stopped(), max_score=self.max_score), self.results_path)
        os._exit(1)
