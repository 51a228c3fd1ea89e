"""How a worker's process comes to be: forked from its part's fork server where one can
serve it, else started as a new interpreter; confined the same way either way.

The parent's side only. :func:`launch` returns a process with ``Popen``'s ``pid``,
``stdout``, ``wait`` and ``poll``; the worker client does the rest.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from dataclasses import dataclass

from grader.core.registry import PARTS
from grader.sandbox.cgroups import CpuGroup
from grader.sandbox.confine import Confinement
from grader.sandbox.forkserver import ForkedWorker, ForkServerError, server_for
from grader.sandbox.forkserver import start_interpreter as started
from grader.sandbox.sandbox import (
    Limits,
    Sandbox,
    confinement,
    network_isolation,
    worker_environment,
)
from grader.sandbox.view import with_view


@dataclass(frozen=True)
class Launch:
    """One worker to start: its part, the folder it imports from, and where it runs."""

    part: str
    submission_dir: str
    sandbox: Sandbox
    limits: Limits
    device: str
    threads: int
    cpu_group: CpuGroup | None = None  # the worker's cgroup, where one could be made
    #: The reference solution: runs as the trusted account, with folders of its own.
    trusted: bool = False
    #: Libraries the fork server imports once this worker is forked, while it runs: the
    #: next part's (``registry.imports_ahead``).
    ahead: tuple[str, ...] = ()

    def arguments(self, in_fd: str, out_fd: str) -> list[str]:
        """The worker's ``main.py`` and its arguments."""
        return [
            str(self.sandbox.worker_dir / "main.py"),
            *("--part", self.part, "--submission", self.submission_dir),
            *("--in-fd", in_fd, "--out-fd", out_fd),
        ]

    def confinement(self) -> Confinement:
        """The limits, namespaces and account of this grading's workers."""
        isolate = self.limits.isolate_network and not network_isolation()
        procs = self.cpu_group.procs_file if self.cpu_group is not None else None
        if self.trusted:  # the reference reads a copy the worker account cannot
            identity = self.sandbox.trusted_identity()
            return confinement(
                self.limits, identity, isolate, None, self.device, procs, trusted=True
            )
        identity = self.sandbox.identity
        spec = confinement(self.limits, identity, isolate, None, self.device, procs)
        # The worker account's view of the files (grader/sandbox/view.py).
        return with_view(spec, self.sandbox.root, self.sandbox.hidden)


#: ``KVGRADER_FORK_ON_GPU=1``: fork GPU workers too, from a server that imported the
#: part's libraries without loading the CUDA driver (it refuses to start otherwise,
#: ``forkserver_main.refuse_after_cuda``). Off by default until a GPU grading confirms it:
#: ``benchmarks/gpu_cost.sh`` grades both ways.
FORK_ON_GPU = "KVGRADER_FORK_ON_GPU"
#: What a GPU worker's server adds to its environment: torch's availability check asks
#: NVML instead of loading the driver (the worker's own environment is the sandbox's).
GPU_SERVER_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}

#: How this process's workers were started, counted: forked from a batch's shared fork
#: server, from this grading's own, or as new interpreters (a results file says which).
STARTS: Counter[str] = Counter()
SHARED, OWN, INTERPRETER = "shared fork server", "fork server", "new interpreter"


def launch(job: Launch, req_r: int, resp_w: int) -> subprocess.Popen | ForkedWorker:
    """The worker's process, reading requests from ``req_r`` and replying on ``resp_w``."""
    spec = job.confinement()
    env = job.sandbox.environment(job.device, job.threads, trusted=job.trusted)
    forked = _forked(job, spec, env, (req_r, resp_w))
    if forked is not None:
        STARTS[SHARED if forked.server.adopted_pid is not None else OWN] += 1
        return forked
    STARTS[INTERPRETER] += 1
    argv = job.arguments(str(req_r), str(resp_w))
    return started(
        argv, env=env, cwd=job.submission_dir, confinement=spec, pass_fds=(req_r, resp_w)
    )


def forks_on(device: str) -> bool:
    """Whether workers on ``device`` are forked from a fork server: on the CPU, and on a
    GPU where ``KVGRADER_FORK_ON_GPU=1``."""
    return device == "cpu" or os.environ.get(FORK_ON_GPU) == "1"


def _forked(
    job: Launch, spec: Confinement, env: dict[str, str], fds: tuple[int, int]
) -> ForkedWorker | None:
    """The worker forked from its part's fork server, or None where there is none (a GPU
    unless :func:`forks_on` it, a part that preloads nothing, the switch off) or it
    failed; a failure is said in the run's warnings, where TAs look: the grading is the
    same, only slower."""
    if job.part not in PARTS or not forks_on(job.device):
        return None
    server_env = worker_environment(None, job.device, job.threads)
    if job.device != "cpu":
        server_env.update(GPU_SERVER_ENV)
    try:
        server = server_for(PARTS[job.part].preload, server_env)
        if server is None:
            return None
        forked = server.spawn(
            argv=job.arguments("{in_fd}", "{out_fd}"),
            env=env,
            cwd=job.submission_dir,
            confinement=spec,
            pass_fds=fds,
        )
        if job.ahead:
            server.import_ahead(job.ahead)
        return forked
    except ForkServerError as exc:
        if f"{exc}" not in job.sandbox.warnings:
            job.sandbox.warnings.append(f"{exc}")
        return None
