"""grader/runtime/client_output.py: a worker's exception, told to the student."""

from __future__ import annotations

import signal
import traceback

from grader.runtime.client_output import (
    ERROR_FIELD_CHARS,
    bounded_error,
    death_message,
    describe_error,
    syntax_sentence,
)
from grader.sandbox.confine import NO_MOUNTS


def test_every_frame_of_a_traceback_is_indented_alike() -> None:
    frames = [
        traceback.FrameSummary("llama/model.py", 189, "forward", line="h = layer(h)"),
        traceback.FrameSummary("llama/model.py", 124, "forward", line="scores = scores + mask"),
    ]
    error = {
        "type": "RuntimeError",
        "message": "size mismatch",
        "where": "llama/model.py, line 124, in forward",
        "traceback": "".join(traceback.format_list(frames)),
    }
    text = describe_error(error, "forward(...)", "llama/model.py")
    after = text.split("Traceback (your code):\n", 1)[1].splitlines()
    assert [line[:7] for line in after if "File" in line] == ["  File ", "  File "]
    assert [line[:4] for line in after if "File" not in line] == ["    ", "    "]


def test_no_traceback_heading_without_frames() -> None:
    error = {"type": "ValueError", "message": "bad", "traceback": "  \n"}
    assert "Traceback" not in describe_error(error, "f()", "x.py")


def test_a_syntax_error_names_its_file_and_line_once() -> None:
    error = {"type": "SyntaxError", "where": "question1.py, line 84",
             "message": "expected ':'; the line reads: def f(x) -> int"}  # fmt: skip
    said = syntax_sentence("question1.py", error)
    assert said == (
        "question1.py has a syntax error on line 84: expected ':'; the line reads: def f(x) -> int"
    )
    assert said.count("question1.py") == 1
    other = syntax_sentence("llama/generation.py", {**error, "where": "llama/model.py, line 3"})
    assert other.startswith(
        "llama/generation.py could not be imported: llama/model.py has a syntax error on line 3:"
    )
    assert syntax_sentence("q.py", {"message": "bad"}) == "q.py has a syntax error: bad"


def test_a_dead_worker_is_told_by_its_exit() -> None:
    def said(code: int | None, expired: bool = False) -> tuple[str, str]:
        return death_message("generate(...)", code, expired=expired, budget_s=900)

    message, kind = said(-signal.SIGKILL)
    assert kind == "crash" and "too much memory" in message
    assert message.startswith("generate(...) stopped the grader's worker")
    assert "SIGUSR1" in said(-signal.SIGUSR1)[0]  # a signal without a reason is named
    assert "exited with status 3" in said(3)[0] and "os._exit()" in said(3)[0]
    message, kind = said(NO_MOUNTS)  # the grader's fault, not the student's
    assert kind == "crash" and "not your fault" in message
    message, kind = said(-signal.SIGKILL, expired=True)  # the watchdog, whatever the exit
    assert kind == "timeout" and "900 s time budget" in message


def test_a_forged_exception_description_is_cut_where_the_student_cannot_reach() -> None:
    """The worker cuts its own descriptions, but it runs beside the student's code, which
    can send any: the parent keeps each known field cut (the traceback's end, nearest the
    error), drops the rest, and reads anything that is not a description as none."""
    forged = {
        "type": "E" * 10**6,
        "message": "m" * 10**7,
        "where": "w" * 10**6,
        "traceback": "head" + "t" * 10**7 + "the last frame",
        "extra": "x" * 10**6,
    }
    kept = bounded_error(forged)
    assert {k: len(v) for k, v in kept.items()} == ERROR_FIELD_CHARS
    assert kept["traceback"].endswith("the last frame") and "head" not in kept["traceback"]
    assert len(describe_error(kept, "f()", "q.py")) < 7000
    assert bounded_error("Traceback ...") == {} and bounded_error(None) == {}
    assert bounded_error({"type": ["a"], "message": 3}) == {"type": "", "message": "3"}
