"""The parent's handle on one worker process: start it, send requests, contain it.

Every failure of the submission (it does not import, raises, exits, hangs, runs
out of memory, floods its output or sends garbage) becomes a
:class:`SubmissionError` whose message a student can act on. The worker is
restarted for the next request; a failure that would only repeat (an import
that fails, a function that already timed out) is remembered and reported
again at once instead of costing another timeout.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np
import psutil

from grader.runtime import starvation
from grader.runtime.client_output import (
    OutputCollector,
    bounded_error,
    death_message,
    describe_error,
    syntax_sentence,
    too_many_elements,
)
from grader.runtime.gpu_memory import nvml_usage
from grader.runtime.launch import Launch, launch
from grader.runtime.measures import cpu_between, cpu_reading, figures, memory_sampled
from grader.runtime.outcomes import Reply, SubmissionError
from grader.runtime.trace import trace
from grader.runtime.usage import Sampler
from grader.sandbox import cgroups
from grader.sandbox.cgroups import PROCESS_TREE, CpuGroup
from grader.sandbox.forkserver import ForkedWorker
from grader.sandbox.processes import STARTED, become_subreaper, kill_tree, reap_orphans
from grader.sandbox.sandbox import (
    Limits,
    Sandbox,
    WorkerIdentity,
    kill_user_processes,
)
from grader.worker.protocol import (
    ProtocolError,
    ReadTimeout,
    WriteTimeout,
    read_message,
    write_message,
)


@dataclass
class WorkerClient:
    """Runs the worker for one part of one submission inside ``sandbox``."""

    part: str
    module_file: str  # e.g. "question1.py", used in messages
    submission_dir: str  # folder the worker imports from (inside the sandbox)
    sandbox: Sandbox
    limits: Limits
    device: str = "cpu"
    threads: int = 1
    _proc: subprocess.Popen | ForkedWorker | None = None
    _to_worker: int = -1
    _from_worker: int = -1
    _output: OutputCollector | None = None
    _import_error: SubmissionError | None = None
    _timed_out: set[str] = field(default_factory=set)
    _starved: set[str] = field(default_factory=set)  # those of them the machine starved
    _last_starved: bool = False  # whether the last request that timed out was starved
    _next_id: int = 0
    _cpu_group: CpuGroup | None = None
    _sampler: Sampler | None = None
    #: The reference solution's worker: it runs as the trusted account, with a home and
    #: temporary folder of its own (``Sandbox.trusted_folders``), so that its copy can be
    #: closed to the worker account (``Sandbox.provide``) and nothing the submission made
    #: is on its paths.
    trusted: bool = False
    starts: int = 0
    #: Libraries its fork server imports while it runs (see ``Launch.ahead``).
    ahead: tuple[str, ...] = ()
    #: How timed requests read the worker's CPU time (``cgroups.V2``, ``V1`` or
    #: ``PROCESS_TREE``): the last started worker's, for the results.
    cpu_accounting: str = PROCESS_TREE

    # ------------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        """A new worker, once the submission imported in it; an import that failed is
        remembered and raised again at once."""
        if self._import_error is not None:
            raise self._import_error
        self._spawn()
        self._await_import()

    def _spawn(self) -> None:
        """The worker process, as the sandbox's user, under its limits, with its channel.
        This process becomes the reaper of the worker's orphans, so that their CPU time is
        charged to the worker (see ``usage.cpu_snapshot``)."""
        become_subreaper()
        # Its memory sampler lives as long as it does, so that the grader's threads are the
        # same during every request, timed or not; NVML is loaded before it starts, too.
        self._close_sampler()  # one a start that failed before its worker ran left
        self._sampler = Sampler()
        self._sampler.start()
        if self.device == "cuda":
            nvml_usage()
        self._cpu_group = cgroups.create(self.part)
        self.cpu_accounting = self._cpu_group.accounting if self._cpu_group else PROCESS_TREE
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        job = Launch(
            self.part,
            self.submission_dir,
            self.sandbox,
            self.limits,
            self.device,
            self.threads,
            self._cpu_group,
            self.trusted,
            self.ahead,
        )
        try:
            self._proc = launch(job, req_r, resp_w)
        except BaseException:
            self._drop_cpu_group()
            self._close_sampler()
            raise
        finally:
            os.close(req_r)
            os.close(resp_w)
        STARTED.add(self._proc.pid)
        self.starts += 1
        os.set_blocking(req_w, False)  # writes are deadline-bounded: see request()
        self._to_worker, self._from_worker = req_w, resp_r
        self._output = OutputCollector(self._proc.stdout.fileno(), self.limits.max_output_bytes)
        self._output.start()

    def _await_import(self) -> None:
        """The worker's first message: whether the submission imported."""
        assert self._output is not None
        try:
            header, _ = self._receive(self.limits.startup_timeout_s)
        except SubmissionError as exc:
            self._import_error = SubmissionError(
                f"{self.module_file} could not be loaded: {exc}", kind="import", output=exc.output
            )
            self.stop()
            raise self._import_error from None
        if not header.get("ok"):
            error = bounded_error(header.get("error"))
            detail = describe_error(error, f"importing {self.module_file}", self.module_file)
            if error.get("type") in ("SyntaxError", "IndentationError"):
                detail = syntax_sentence(self.module_file, error)
            self._import_error = SubmissionError(
                detail, kind="import", output=self._output.since_mark()
            )
            self.stop()
            raise self._import_error

    def stop(self) -> None:
        """Kill the worker's whole process group, everything else this grading run's
        worker user started (escaped daemons, fork bombs), and close the channel."""
        proc = self._proc
        if proc is not None:
            kill_tree(proc.pid)
            proc.wait()
            kill_user_processes(self._identity())
            STARTED.discard(proc.pid)
            self._drop_cpu_group()  # kills what is left in it, wherever it was reparented
            reap_orphans()  # the zombies its descendants left with this process
            if self._output is not None:
                self._output.join(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        for fd in (self._to_worker, self._from_worker):
            if fd >= 0:
                os.close(fd)
        self._proc, self._to_worker, self._from_worker = None, -1, -1
        self._close_sampler()

    def _identity(self) -> WorkerIdentity:
        """The account and run gid this client's workers run as."""
        return self.sandbox.trusted_identity() if self.trusted else self.sandbox.identity

    def _close_sampler(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None

    def _drop_cpu_group(self) -> None:
        if self._cpu_group is not None:
            self._cpu_group.remove()
            self._cpu_group = None

    def kill(self) -> None:
        """Kill the worker's processes from another thread (the watchdog): a request
        waiting on it sees the channel close and fails at once; :meth:`stop` tidies up."""
        proc = self._proc
        if proc is not None:
            kill_tree(proc.pid)

    @property
    def running(self) -> bool:
        """Whether a worker process is up (state kept in it, such as loaded models, survives)."""
        return self._proc is not None

    # ------------------------------------------------------------------- requests

    def rss_bytes(self) -> int | None:
        """The worker's resident memory as the kernel reports it, read from here (None when
        no worker runs or it cannot be read): the submission can change it only by what it
        really holds, never forge it."""
        if self._proc is None:
            return None
        try:
            return int(psutil.Process(self._proc.pid).memory_info().rss)
        except psutil.Error:
            return None

    def request(
        self,
        header: dict[str, Any],
        arrays: dict[str, np.ndarray] | None = None,
        *,
        what: str,
        timeout: float | None = None,
        key: str | None = None,
        timed: bool = False,
    ) -> Reply:
        """Send one request; return the reply or raise :class:`SubmissionError`.

        ``what`` names the request for messages, e.g. ``"param_count(spec)"``.
        ``key`` (default: ``what`` up to its first ``(``) groups requests for the
        remembered-timeout rule: once one request of a group timed out, the
        others fail at once instead of each costing another timeout.
        A ``timed`` request is a benchmark run: the parent also reads the CPU time
        the kernel charged the worker's processes during it, and its peak memory
        (see :mod:`grader.runtime.timing`). The clock never includes starting the worker.
        """
        key = key if key is not None else what.split("(")[0]
        self._refuse_if_stopped(what, key)
        began = time.perf_counter()
        if self._proc is None:
            self._start()
        started = time.perf_counter() - began
        assert self._output is not None
        self._output.since_mark()
        limit = timeout if timeout is not None else self.limits.request_timeout_s
        self._next_id += 1
        rid = self._next_id
        reply, out_arrays, measured = self._exchange(
            {**header, "id": rid}, arrays, what=what, key=key, limit=limit, timed=timed
        )
        output = self._output.since_mark()
        cpu, pid = measured["cpu_seconds"], getattr(self._proc, "pid", None)
        trace(
            part=self.part, trusted=self.trusted, pid=pid, what=what, op=header.get("op"),
            timed=timed, start_s=round(started, 3), seconds=round(measured["seconds"], 3),
            cpu_s=round(cpu, 3) if cpu is not None else None,
        )  # fmt: skip
        self._check_reply(reply, rid, what, output)
        return Reply(header=reply, arrays=out_arrays, output=output, **measured)

    def _refuse_if_stopped(self, what: str, key: str) -> None:
        """Nothing runs past the grading's budget, nor again after a timeout of its group."""
        if self.sandbox.expired.is_set():
            raise SubmissionError(
                f"{what} was not run: the grading ran past its time budget.", kind="timeout"
            )
        if key in self._starved:
            raise SubmissionError(
                f"{what} was not run: an earlier run of it was stopped while the machine was "
                "busy, not because of your code. This check should be graded again: ask the "
                "course staff for a regrade.",
                kind="timeout",
            )
        if key in self._timed_out:
            raise SubmissionError(
                f"{what} was not run: it already ran past the time limit in an earlier check.",
                kind="timeout",
            )

    def _exchange(
        self,
        message: dict[str, Any],
        arrays: dict[str, np.ndarray] | None,
        *,
        what: str,
        key: str,
        limit: float,
        timed: bool,
    ) -> tuple[dict, dict, dict[str, Any]]:
        """Send ``message`` and read the reply, clocked from here; a ``timed`` request
        also gets the CPU time charged to the worker and its peak memory. Every request is
        measured the same way, timed or not (:mod:`grader.runtime.measures`)."""
        assert self._proc is not None
        pid = self._proc.pid
        # The run's own gid when the worker was dropped to it: work a daemon does outside
        # the worker's tree is charged too (see cpu_snapshot).
        identity = self._identity()
        run_gid = identity.gid if identity.dropped else None
        server = getattr(self._proc, "server", None)
        reading = (self._cpu_group, pid, run_gid, server.pid if server is not None else None)
        gpu = nvml_usage() if self.device == "cuda" else None
        with memory_sampled(pid, self.device, self._sampler, gpu) as held:
            cpu_before = cpu_reading(*reading)
            start = time.perf_counter()
            self._send(message, arrays, what=what, key=key, limit=limit)
            try:
                reply, out_arrays = self._receive(limit, what=what)
            except SubmissionError as exc:
                if exc.kind == "timeout":
                    self._timed_out.add(key)
                    if self._last_starved:
                        self._starved.add(key)
                raise
            seconds = time.perf_counter() - start
            cpu = cpu_between(self._cpu_group, cpu_before, cpu_reading(*reading))
        return reply, out_arrays, figures(reply, held, cpu, seconds, self.device, timed)

    def _send(
        self, message: dict[str, Any], arrays: dict | None, *, what: str, key: str, limit: float
    ) -> None:
        assert self._output is not None
        try:
            write_message(self._to_worker, message, arrays, deadline=time.monotonic() + limit)
        except WriteTimeout:
            self._timed_out.add(key)
            output = self._output.since_mark()
            self.stop()
            raise SubmissionError(
                f"{what} was not run: your code stopped reading the grader's requests "
                f"for {limit:.0f} s.",
                kind="timeout",
                output=output,
            ) from None
        except (BrokenPipeError, OSError):
            self._died(what)

    def _check_reply(self, reply: dict, rid: int, what: str, output: str) -> None:
        """The reply answers this request, and says it succeeded."""
        if reply.get("id") != rid:
            # Not the answer to this request: a forked copy of the worker, or bytes the
            # submission wrote to the channel itself. Nothing after it can be trusted.
            self.stop()
            raise SubmissionError(
                f"{what}: the grader received a reply that does not belong to this request "
                "(did your code fork, or write to the grader's channel?).",
                kind="protocol",
                output=output,
            )
        if not reply.get("ok"):
            error = bounded_error(reply.get("error"))
            raise SubmissionError(
                describe_error(error, what, self.module_file),
                kind="exception",
                output=output,
                error=error,
            )

    def _receive(self, timeout: float, what: str = "") -> tuple[dict, dict]:
        """The worker's reply. One that does not come in ``timeout`` is the code's fault
        (it spun or waited on itself) unless the worker was ready to run and the machine
        gave the CPU to others: then the message says so (:mod:`grader.runtime.starvation`)."""
        deadline = time.monotonic() + timeout
        label = what or f"importing {self.module_file}"
        pid = getattr(self._proc, "pid", None)
        clocks = starvation.read(self._cpu_group, pid)
        try:
            header, arrays = read_message(
                self._from_worker, deadline=deadline, max_bytes=self.limits.max_response_bytes
            )
            too_many = too_many_elements(arrays, self.limits.max_response_bytes)
            if too_many:
                raise ProtocolError(too_many)
            return header, arrays
        except MemoryError:
            # The grader's own ceiling (grader/sandbox/ceiling.py), met half-way through a
            # reply: the channel is out of step, so the worker goes too.
            self.stop()
            raise SubmissionError(
                f"{label}: the grader had no memory left to read your code's reply; "
                "the reply was dropped.",
                kind="protocol",
            ) from None
        except ReadTimeout:
            output = self._output.since_mark() if self._output else ""
            if self.sandbox.expired.is_set():
                # The watchdog stopped the worker first; its kill had not closed the
                # channel yet when the request's own limit passed: the deadline cut it.
                self.stop()
                message, kind = death_message(
                    label, None, expired=True, budget_s=self.limits.grading_timeout_s
                )
                raise SubmissionError(message, kind, output) from None
            ended = starvation.read(self._cpu_group, pid, final=True)
            self._last_starved = starvation.was_starved(clocks, ended)
            self.stop()
            raise SubmissionError(
                starvation.timeout_message(label, timeout, clocks, ended),
                kind="timeout",
                output=output,
            ) from None
        except EOFError:
            self._died(label)
        except ProtocolError as exc:
            output = self._output.since_mark() if self._output else ""
            self.stop()
            raise SubmissionError(
                f"{label}: the grader received garbage from your code ({exc}).",
                kind="protocol",
                output=output,
            ) from None

    def _died(self, label: str) -> NoReturn:
        proc = self._proc
        code = proc.wait(timeout=10) if proc is not None else None
        output = self._output.since_mark() if self._output else ""
        self.stop()
        message, kind = death_message(
            label, code, expired=self.sandbox.expired.is_set(),
            budget_s=self.limits.grading_timeout_s,
        )  # fmt: skip
        raise SubmissionError(message, kind, output)
