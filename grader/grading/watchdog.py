"""The whole grading's deadline, kept by a thread the submission cannot block."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from grader.core.results import fallback_results, write_results


class Watchdog:
    """The whole grading's deadline, kept by a thread the submission cannot block.

    When it passes, ``on_expire`` stops the run's workers: whatever check is
    waiting on one fails at once, the rest fail fast, and the results are
    written as usual. If the grader still has not finished ``grace_s`` later,
    the thread writes a valid results file itself and ends the process.
    """

    def __init__(
        self,
        seconds: float,
        on_expire: Callable[[], None],
        results_path: Path,
        max_score: float,
        grace_s: float = 60.0,
    ) -> None:
        self.seconds, self.grace_s = seconds, grace_s
        self.on_expire, self.results_path, self.max_score = on_expire, results_path, max_score
        self.done = threading.Event()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def finish(self) -> None:
        self.done.set()
        self._timer.cancel()

    def _expire(self) -> None:
        with contextlib.suppress(Exception):
            self.on_expire()
        if self.done.wait(self.grace_s):
            return
        write_results(
            fallback_results(
                f"The grading did not finish within {self.seconds:.0f} s and was stopped. "
                "This is not your fault if your code is quick; please tell the course staff.",
                max_score=self.max_score,
            ),
            self.results_path,
        )
        os._exit(1)
