"""The heavy condition of ``verdict_stability.py``: a busy loop on every CPU this process
may use, and other gradings side by side, restarted as they end, so that every graded run
shares the machine with them (a load of about 8 on 2 cores)."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

Start = Callable[[], tuple[subprocess.Popen, Path]]


class HeavyLoad:
    """``hogs`` busy loops and ``companions`` gradings kept running until :meth:`stop`:
    ``start()`` starts one companion grading (its results are thrown away)."""

    def __init__(self, hogs: list[subprocess.Popen], start: Start, companions: int = 2):
        self.hogs, self.start, self.done = hogs, start, threading.Event()
        self.running = [start() for _ in range(companions)]
        self.thread = threading.Thread(target=self._keep_going, daemon=True)
        self.thread.start()

    def _keep_going(self) -> None:
        while not self.done.wait(1.0):
            for i, (process, out) in enumerate(self.running):
                if process.poll() is not None:
                    shutil.rmtree(out.parent, ignore_errors=True)
                    self.running[i] = self.start()

    def stop(self) -> None:
        """End the companions and the busy loops, and wait for them."""
        self.done.set()
        self.thread.join()
        for process in [*(p for p, _ in self.running), *self.hogs]:
            process.kill()
            process.wait()
        for _, out in self.running:
            shutil.rmtree(out.parent, ignore_errors=True)
