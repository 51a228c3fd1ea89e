"""What a worker says besides its replies: the output it prints, drained and capped per
request, and the exceptions it reports and the way it died, turned into sentences a
student can act on."""

from __future__ import annotations

import os
import select
import signal
import threading
from typing import Any

from grader.sandbox.confine import (
    NO_CPU_GROUP,
    NO_IPC_NAMESPACE,
    NO_MOUNTS,
    NO_NETWORK_NAMESPACE,
    NO_PRIVILEGE_LOCK,
)


class OutputCollector(threading.Thread):
    """Drains the worker's stdout/stderr, keeping at most ``cap`` bytes.

    The cap applies per request. Reads happen under a lock, so
    :meth:`since_mark` can drain whatever is still in the pipe: everything the
    worker printed before its reply is attributed to that request.
    """

    def __init__(self, fd: int, cap: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.cap = cap
        self.kept = bytearray()
        self.total = 0
        self.closed = False
        self.lock = threading.Lock()

    def _read_available(self) -> bool:
        """Read what the pipe holds now; False once the worker closed it. Lock held."""
        while not self.closed and select.select([self.fd], [], [], 0)[0]:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.closed = True
                break
            self.total += len(chunk)
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
        return not self.closed

    def run(self) -> None:
        while True:
            select.select([self.fd], [], [], 0.05)
            with self.lock:
                if not self._read_available():
                    return

    def since_mark(self) -> str:
        """Output since the last call (at most ``cap`` bytes of it), then start afresh."""
        with self.lock:
            self._read_available()
            text = self.kept.decode("utf-8", "replace")
            total = self.total
            self.kept, self.total = bytearray(), 0
        if total > len(text.encode("utf-8", "replace")) and text:
            text += f"\n[... output truncated: {total:,} bytes printed in all]"
        return text


#: The bytes each element of a reply's arrays is allowed, counted against the reply's
#: limit: a check may hold a copy of a reply in float32 or float64 beside it, and a bool
#: or int8 array of the limit's bytes would be eight times that as float64.
BYTES_PER_ELEMENT = 4


def too_many_elements(arrays: dict[str, Any], max_bytes: int) -> str:
    """Why a reply's ``arrays`` hold more elements than the grader checks ("" when they
    do not): at most ``max_bytes / BYTES_PER_ELEMENT`` in all, whatever their type, so
    that no check's conversion of them grows past what the reply's own limit foresaw."""
    count = sum(int(getattr(a, "size", 0)) for a in arrays.values())
    most = max_bytes // BYTES_PER_ELEMENT
    if count <= most:
        return ""
    return f"its arrays hold {count:,} numbers, more than the {most:,} the grader checks"


#: The most characters of each field of a worker's exception description the parent keeps:
#: what the worker itself sends (its message and traceback cut), enforced where the
#: submission cannot reach, so that no text it forges grows the parent's work or the page.
ERROR_FIELD_CHARS = {"type": 200, "message": 2000, "where": 500, "traceback": 4000}


def bounded_error(error: Any) -> dict[str, str]:
    """A worker's exception description as the parent keeps it: the known fields, each a
    string cut to :data:`ERROR_FIELD_CHARS` (the traceback keeps its end, the frames
    nearest the error); anything else in it, or anything that is not a description,
    is dropped."""
    if not isinstance(error, dict):
        return {}
    kept = {}
    for key, most in ERROR_FIELD_CHARS.items():
        if key in error:
            text = str(error[key]) if isinstance(error[key], (str, int, float)) else ""
            kept[key] = text[-most:] if key == "traceback" else text[:most]
    return kept


def describe_error(error: dict[str, Any], what: str, module_file: str) -> str:
    """Turn a worker-side exception description into a student-facing sentence."""
    etype = str(error.get("type", "Exception"))
    message = str(error.get("message", ""))
    where = str(error.get("where", ""))
    at = f" ({where})" if where else ""
    if etype == "MissingName":
        return f"{module_file} does not define `{message}`, which the grader calls."
    if etype == "LoadError":  # raised by an adapter: the reason is already student-facing
        return f"{what} cannot be loaded: {message}."
    if etype == "NotImplementedError":
        return f"{what} is not implemented yet: it raises NotImplementedError{at}."
    if etype == "SystemExit":
        return f"{what} called sys.exit({message}){at}; the grader needs it to return a value."
    if etype == "MemoryError":
        return f"{what} ran out of memory{at}."
    text = f"{what} raised {etype}: {message}{at}"
    tb = str(error.get("traceback", "")).rstrip()  # every frame keeps its indent
    if tb.strip():
        text += f"\nTraceback (your code):\n{tb.lstrip(chr(10))}"
    return text


def syntax_sentence(module_file: str, error: dict[str, Any]) -> str:
    """A syntax error found while importing ``module_file``, its place named once:
    ``question1.py has a syntax error on line 84: expected ':'; the line reads: ...``
    (or the other file of the submission it is in)."""
    where, message = str(error.get("where", "")), str(error.get("message", ""))
    file, _, line = where.partition(", line ")
    if not where:
        return f"{module_file} has a syntax error: {message}"
    at = f" on line {line}" if line else ""
    if file == module_file:
        return f"{module_file} has a syntax error{at}: {message}"
    return f"{module_file} could not be imported: {file} has a syntax error{at}: {message}"


#: The worker's exit codes when it could not be isolated (``grader.sandbox.confine``).
ISOLATION_FAILED = (NO_MOUNTS, NO_NETWORK_NAMESPACE, NO_PRIVILEGE_LOCK, NO_CPU_GROUP,
                    NO_IPC_NAMESPACE)  # fmt: skip
#: What a signal that ended the worker most likely means, in a student's words.
SIGNAL_REASONS = {
    "SIGKILL": "it was killed (usually for using too much memory)",
    "SIGXFSZ": "it wrote a file larger than the limit",
    "SIGXCPU": "it used too much CPU time",
    "SIGSEGV": "it crashed (segmentation fault)",
}


def death_message(
    label: str, code: int | None, *, expired: bool, budget_s: float
) -> tuple[str, str]:
    """The message and kind of a worker that died during ``label`` with exit ``code``
    (negative: the signal), or that the grading's watchdog stopped (``expired``): the
    grader's own failures said to be the staff's, the student's said to be theirs."""
    if expired:  # the watchdog stopped it, not the submission
        return (
            f"{label} was stopped before it finished: the whole grading ran past its "
            f"{budget_s:.0f} s time budget.",
            "timeout",
        )
    if code in ISOLATION_FAILED:
        return (
            f"{label}: the grader could not isolate the worker (network, IPC, files, "
            "CPU accounting or privileges); "
            "this is not your fault, please tell the course staff.",
            "crash",
        )
    if code is not None and code < 0:
        sig = signal.Signals(-code).name
        reason = SIGNAL_REASONS.get(sig, f"it was killed by {sig}")
    else:
        reason = f"the process exited with status {code} (did your code call os._exit() or exit()?)"
    return f"{label} stopped the grader's worker: {reason}.", "crash"
