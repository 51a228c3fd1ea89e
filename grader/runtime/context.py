"""Everything one grading run shares: the sandbox, the workers, the test cases."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.core.paths import SOLUTION, TEST_CASES
from grader.core.registry import PARTS
from grader.runtime.client import WorkerClient
from grader.runtime.outcomes import SubmissionError
from grader.runtime.timing import BenchmarkRecord
from grader.sandbox.layout import PartLayout
from grader.sandbox.sandbox import Limits, Sandbox


def load_cases(part: str, root: Path = TEST_CASES) -> dict[str, Any]:
    """A part's public and (when present) hidden cases, merged into one case set.

    Case lists are concatenated (each case tagged with its visibility), tables
    such as ``diagnoses`` or ``models`` are merged key by key, and any other
    value is taken from the last file that has it.
    """
    merged: dict[str, Any] = {"cases": [], "diagnoses": {}, "hidden_available": False}
    for visibility in ("public", "hidden"):
        path = root / visibility / f"{part}.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        for key, value in data.items():
            if key == "cases":
                merged["cases"].extend({**c, "visibility": visibility} for c in value)
            elif isinstance(value, dict):
                merged.setdefault(key, {}).update(value)
            else:
                merged[key] = value
        merged["hidden_available"] |= visibility == "hidden"
    return merged


REFERENCE = "reference"  # the sandbox's name for the reference solution's copy


def live_pools_key(part: str) -> str:
    """Where the scratch state keeps the prompt pools the reference built for ``part`` in
    this grading (a GPU workload's)."""
    return f"{part}.live_pools"


@dataclass
class GradingContext:
    """Shared state of one grading run; checks reach the submission only through it."""

    sandbox: Sandbox
    limits: Limits
    device: str
    bases: dict[str, Path | None]  # per part: the submission folder inside the sandbox
    #: Per part not graded for want of a file: what to upload (named once on the page).
    missing: dict[str, str] = field(default_factory=dict)
    cases_root: Path = TEST_CASES
    threads: int = 1
    #: Per part, the libraries its worker's fork server imports ahead, while that worker
    #: runs (``registry.imports_ahead``); set once the checks to run are known.
    ahead: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: Per part, what runs once before its submission worker first starts (set by the
    #: runner): the reference's timed runs, so that no reference session stops the
    #: submission's worker halfway through the part and makes it start again.
    before_first_worker: dict[str, Callable[[], None]] = field(default_factory=dict)
    _workers: dict[str, WorkerClient] = field(default_factory=dict)
    _cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)  # per-run state checks share
    benchmarks: dict[str, BenchmarkRecord] = field(default_factory=dict)  # by check number
    #: Seeded model weights by what they were drawn from, kept across reference sessions
    #: (they are the same for the reference and the submission by construction).
    _weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Per part, the reference's worker a session left running (``linger``), with what the
    #: session knew it holds (its models): the part's next reference session uses it.
    _lingering: dict[str, tuple[WorkerClient, dict[str, Any]]] = field(default_factory=dict)

    def worker(self, part: str) -> WorkerClient:
        """The part's worker; raises :class:`SubmissionError` if its file is missing."""
        main_file = PARTS[part].main_file
        base = self.bases.get(part)
        if base is None:
            raise SubmissionError(self.missing_message(part), kind="missing")
        # One worker alive at a time: each holds its own torch (hundreds of MB), and
        # Gradescope's default container has 768 MB. Parts are graded one after
        # another, so a stopped worker is rarely needed again (it would restart).
        for other, client in self._workers.items():
            if other != part and client.running:
                client.stop()
        if part not in self._workers:
            prepare = self.before_first_worker.pop(part, None)
            if prepare is not None:
                prepare()
            self._workers[part] = WorkerClient(
                part=part,
                module_file=main_file,
                submission_dir=str(base),
                sandbox=self.sandbox,
                limits=self.limits,
                device=self.device,
                threads=self.threads,
                ahead=self.ahead.get(part, ()),
            )
        self.end_lingering()  # the reference's copy leaves before the submission runs
        return self._workers[part]

    def stop_worker(self, part: str) -> None:
        """Stop ``part``'s worker, if it runs: its next request starts a fresh one."""
        client = self._workers.get(part)
        if client is not None and client.running:
            client.stop()

    def cpu_accounting(self) -> list[str]:
        """How the timed requests of the submission's workers read their CPU time
        (:mod:`grader.sandbox.cgroups`), for the results: one entry per way used."""
        return sorted({c.cpu_accounting for c in self._workers.values() if c.starts})

    def missing_message(self, part: str) -> str:
        """Why ``part`` is not graded, in one line: the files to upload."""
        missing = PartLayout(None, missing=[PARTS[part].main_file])
        return self.missing.get(part) or missing.missing_message(PARTS[part])

    def reference_available(self, part: str, source: Path = SOLUTION) -> bool:
        """Whether the reference solution of ``part`` is here (the kit's checkout and the
        autograder zip hold it; a student's copy does not)."""
        return (source / PARTS[part].main_file).is_file()

    def reference_worker(self, part: str, source: Path = SOLUTION) -> WorkerClient:
        """A worker that runs the reference solution (trusted code) for ``part`` in this
        grading's sandbox, on the grading device and under the same limits, for
        :meth:`reference_session`. Every other worker is stopped first."""
        if not self.reference_available(part, source):
            raise RuntimeError(
                f"the reference solution ({source}) is not here: the benchmark's workload "
                "needs it to build its prompts. Grade from the kit's checkout."
            )
        self.end_lingering()
        for client in self._workers.values():
            if client.running:
                client.stop()
        base = self.sandbox.provide(source, REFERENCE, private=True)
        return WorkerClient(
            part=part,
            module_file=PARTS[part].main_file,
            submission_dir=str(base),
            sandbox=self.sandbox,
            limits=self.limits,
            device=self.device,
            threads=self.threads,
            trusted=True,
        )

    @contextmanager
    def reference_session(
        self, part: str, keep: Iterable[str] | None = None, *, linger: bool = False
    ) -> Iterator[WorkerClient]:
        """For the ``with`` block, the part's worker is the reference's (see
        :meth:`reference_worker`), so the part's own check machinery can drive it: it builds
        what only the reference can (the prompt pools of a GPU workload) before the
        submission's worker first starts, and it is timed as the yardstick of the
        submission's runs. Then it is stopped, its copy leaves the sandbox (the submission
        never sees it), and whatever the checks recorded meanwhile in the scratch state
        (models built, notes) is dropped, except what the block stored under keys that
        existed before it. With ``keep``, the block sees only those keys of the scratch
        state (nothing the checks learnt about the submission: its layout, its
        conventions, its models), and the whole state is given back afterwards.

        With ``linger``, a block that ends normally leaves the worker running, and the
        part's next reference session takes it over with the models it built (a GPU
        worker's start and its benchmark model cost seconds each): the prompt pools'
        session, then the yardstick's. It is stopped, and the reference's copy withdrawn,
        before any submission worker is made (:meth:`end_lingering`)."""
        saved = self.scratch
        if keep is not None:
            self.scratch = {k: v for k, v in saved.items() if k in set(keep)}
        before = set(self.scratch)
        # What was built in (or failed to build in) the submission's worker says nothing
        # about the reference's: the block starts without it, and gets it back after.
        state = (f"{part}.built", f"{part}.failed")
        held = {k: self.scratch.pop(k) for k in state if k in self.scratch}
        client, known = self._take_lingering(part)
        self.scratch.update(known)  # what a worker taken over already holds
        own = self._workers.pop(part, None)
        self._workers[part] = client
        kept = False
        try:
            yield client
            kept = linger and client.running
        finally:
            if kept:
                self._lingering[part] = (
                    client,
                    {k: self.scratch[k] for k in state if k in self.scratch},
                )
            else:
                client.stop()
                self.sandbox.withdraw(REFERENCE)
            self._workers.pop(part, None)
            if own is not None:
                self._workers[part] = own
            for key in set(self.scratch) - before:
                del self.scratch[key]
            self.scratch.update(held)
            if keep is not None:
                self.scratch = saved

    def built(self, part: str) -> dict[str, int]:
        """What ``part``'s worker has built (a model, by key), each with the count of that
        worker's starts when it did: a restarted worker builds again."""
        return self.scratch.setdefault(f"{part}.built", {})

    def _take_lingering(self, part: str) -> tuple[WorkerClient, dict[str, Any]]:
        """The reference's worker of ``part`` a session left running, with what it holds;
        else a new one (every other worker stopped first)."""
        if part in self._lingering:
            client, known = self._lingering.pop(part)
            if client.running:
                for other in [*(c for c, _ in self._lingering.values()), *self._workers.values()]:
                    other.stop()  # one worker at a time (the reference's copy stays)
                self._lingering.clear()
                return client, known
            self.sandbox.withdraw(REFERENCE)
        return self.reference_worker(part), {}

    def end_lingering(self) -> None:
        """Stop the reference's workers left running by a session, and withdraw the
        reference's copy from the sandbox."""
        if self._lingering:
            for client, _ in self._lingering.values():
                client.stop()
            self._lingering.clear()
            self.sandbox.withdraw(REFERENCE)

    def seeded_weights(
        self, part: str, spec: dict[str, Any], draw: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """``draw()``'s weights of ``part``'s model ``spec`` (what they are drawn from),
        drawn once per grading: every worker that loads the model, the reference's and the
        restarted ones, gets the same arrays (a public-sized benchmark model takes a core
        a noticeable part of a second; a GPU workload's is drawn by its worker instead)."""
        key = f"{part}:{json.dumps(spec, sort_keys=True)}"
        if key not in self._weights:
            self._weights[key] = draw()
        return self._weights[key]

    def cases(self, part: str) -> dict[str, Any]:
        if part not in self._cases:
            self._cases[part] = load_cases(part, self.cases_root)
        return self._cases[part]

    def kill_workers(self) -> None:
        """Kill every worker's processes now, from any thread (see :meth:`WorkerClient.kill`)."""
        lingering = [client for client, _ in list(self._lingering.values())]
        for client in [*self._workers.values(), *lingering]:
            client.kill()

    def close(self) -> None:
        """Stop every worker (and everything they started)."""
        self.end_lingering()
        for client in self._workers.values():
            client.stop()
