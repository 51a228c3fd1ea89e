"""Worker process: imports one part of a submission and answers requests.

Runs inside the sandbox with the student's code; nothing here is trusted by the
parent. Every answer is plain data (JSON values and numeric arrays), so a
submission that tampers with this process can at worst send wrong data, which
the parent validates like any other answer.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from protocol import MAX_REQUEST_BYTES, read_message, write_message

WORKER_DIR = Path(__file__).resolve().parent


# ------------------------------------------------------------------------ errors


def _display_name(filename: str, submission: Path | None) -> str:
    """A file name as the student knows it: relative to their folder, else the library's."""
    path = Path(filename).resolve()
    if submission is not None and path.is_relative_to(submission):
        return str(path.relative_to(submission))
    return path.name


def syntax_message(exc: SyntaxError) -> str:
    """A syntax error's message without its location (``where`` names it once) and with
    the line it is in: ``"invalid syntax; the line reads: x = = 1"``."""
    line = (exc.text or "").strip()
    return f"{exc.msg}; the line reads: {line}" if line else str(exc.msg)


def describe_exception(exc: BaseException, submission: Path | None = None) -> dict[str, Any]:
    """The exception's type, message, the line of the submission it came from, and a
    traceback of the submission's own frames (the worker's and libraries' left out)."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not Path(f.filename).resolve().is_relative_to(WORKER_DIR)
    ]
    own = [
        f
        for f in frames
        if submission is not None and Path(f.filename).resolve().is_relative_to(submission)
    ]
    where = ""
    anchor = own[-1] if own else (frames[-1] if frames else None)
    if anchor is not None:
        where = (
            f"{_display_name(anchor.filename, submission)}, line {anchor.lineno}, in {anchor.name}"
        )
    message = str(exc)
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{_display_name(exc.filename, submission)}, line {exc.lineno}"
        message = syntax_message(exc)
    # "Traceback (your code)": the submission's frames only (torch's and other libraries'
    # frames say nothing a student can act on); all frames when none is the submission's.
    shown = [
        traceback.FrameSummary(_display_name(f.filename, submission), f.lineno, f.name, line=f.line)
        for f in (own or frames)[-8:]
    ]
    return {
        "type": type(exc).__name__,
        "message": message[:2000],
        "where": where,
        "traceback": "".join(traceback.format_list(shown))[-4000:],
    }


# ------------------------------------------------------------------- timed runs


def _cuda() -> Any:
    """``torch.cuda`` once the submission has put work on a GPU, else None."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    return cuda


def before_timed() -> None:
    """Start a request with an idle GPU and fresh peak-memory statistics. PyTorch keeps
    its cached blocks: handing them back would add allocations to every timed run."""
    cuda = _cuda()
    if cuda is not None:
        cuda.synchronize()
        cuda.reset_peak_memory_stats()


def after_timed() -> dict[str, Any]:
    """Finish a request: wait for queued GPU work, so that the parent's clock covers
    it, and report the request's CUDA peak memory."""
    cuda = _cuda()
    if cuda is None:
        return {}
    cuda.synchronize()
    return {"cuda_peak_bytes": int(cuda.max_memory_allocated())}


def release_cached() -> None:
    """After a request's reply: hand PyTorch's cached GPU blocks back when they exceed
    twice what the request used at its peak, so that a worker holds about what it needs
    and gradings can share a GPU. Runs of one shape reuse their blocks and release
    nothing. The reply is sent first: the request that left the blocks is not charged
    for handing them back (a request sent at once after it may wait for it)."""
    cuda = _cuda()
    if cuda is not None and cuda.memory_reserved() > 2 * cuda.max_memory_allocated():
        cuda.empty_cache()


# --------------------------------------------------------------------------- main


def load_adapter(part: str):
    """Import the part's adapter, which imports the student's module."""
    return importlib.import_module(f"adapter_{part}")


def serve(adapter: Any, in_fd: int, out_fd: int, submission: Path) -> None:
    """Answer requests until the parent closes the channel.

    Every reply echoes its request's ``id``. A process the submission forked
    returns into this loop too; it must never answer (its reply would reach the
    parent as the answer to a later request), so it exits silently.
    """
    me = os.getpid()
    while True:
        try:
            request, arrays = read_message(in_fd, max_bytes=MAX_REQUEST_BYTES)
        except EOFError:
            return
        rid = request.get("id")
        try:
            # Every request is handled as a timed one: nothing tells the submission
            # which requests the parent times.
            before_timed()
            header, out_arrays = adapter.handle(request, arrays)
            header = {**header, **after_timed()}
            reply, blobs = {"ok": True, **header, "id": rid}, out_arrays
        except BaseException as exc:  # SystemExit and KeyboardInterrupt included
            reply, blobs = (
                {"ok": False, "error": describe_exception(exc, submission), "id": rid},
                {},
            )
        if os.getpid() != me:
            os._exit(0)
        write_message(out_fd, reply, blobs)
        release_cached()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", required=True)
    parser.add_argument("--submission", required=True)
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    args = parser.parse_args()

    submission = Path(args.submission).resolve()
    # After the worker's own folder: a submission file named like one of the worker's
    # modules (adapter_part2.py, protocol.py, values.py) can never replace it.
    sys.path.insert(1, str(submission))
    os.chdir(submission)
    try:
        adapter = load_adapter(args.part)
        adapter.setup()
    except BaseException as exc:
        write_message(args.out_fd, {"ok": False, "error": describe_exception(exc, submission)})
        return
    write_message(args.out_fd, {"ok": True, "ready": True})
    serve(adapter, args.in_fd, args.out_fd, submission)


if __name__ == "__main__":
    main()
