"""What a request to a worker ends in: a :class:`Reply`, or a :class:`SubmissionError`
worded for the student."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grader.runtime.timing import Sample


class SubmissionError(Exception):
    """A problem with the submission, worded for the student."""

    def __init__(
        self,
        message: str,
        kind: str = "error",
        output: str = "",
        error: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.output = output
        self.error = (
            error if isinstance(error, dict) else {}
        )  # the worker's description of an exception: type, message

    @property
    def signature(self) -> str:
        """``"Type: message"`` of the exception the submission raised ("" if none)."""
        if not self.error:
            return ""
        return f"{self.error.get('type', '')}: {self.error.get('message', '')}"

    @property
    def message(self) -> str:
        return str(self)


@dataclass
class Reply:
    """A successful answer: its JSON header, its arrays and what the worker printed."""

    header: dict[str, Any]
    arrays: dict[str, np.ndarray]
    output: str = ""
    seconds: float = 0.0  # wall time around the request, by the parent's clock
    peak_bytes: int | None = None  # timed requests: the worker's RSS growth, or its CUDA peak
    peak_source: str | None = None  # where peak_bytes was read: "rss" (the parent), "worker"
    gpu_held_bytes: int | None = None  # timed requests on a GPU: what NVML saw the worker hold
    cpu_seconds: float | None = None  # timed requests: CPU time the kernel charged the worker

    def sample(self, per: int = 1) -> Sample:
        """This timed request as one benchmark run, its times divided by ``per`` (per
        generated token); peak memory as measured, with where it was read."""
        cpu = None if self.cpu_seconds is None else self.cpu_seconds / per
        return Sample(
            self.seconds / per, self.peak_bytes, cpu, self.peak_source, self.gpu_held_bytes
        )
