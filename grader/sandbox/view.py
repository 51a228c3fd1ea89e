"""Which view of the files a grading's workers get, and the confinement that gives it.

The best the machine allows, probed once per grader process:

* ``mount-namespace``: a tree of the worker's own (root with ``CAP_SYS_ADMIN``: a VM,
  Gradescope), :mod:`grader.sandbox.mounts`;
* ``landlock``: Landlock rules over the host's tree (a default Docker container, which
  refuses mount namespaces), :mod:`grader.sandbox.landlock`;
* ``none``: the host's files, closed only by their permissions, with a warning in the
  run's results.

Each grading's results name it (``extra_data["file_view"]``). ``KVGRADER_FILE_VIEW``
asks for a lesser one (``landlock`` or ``none``: a TA comparing, the tests of each).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from grader.sandbox.confine import Confinement
from grader.sandbox.landlock import abi_version, rules_for
from grader.sandbox.mounts import mount_isolation, plan_for
from grader.sandbox.visible import visible

MOUNT_NAMESPACE, LANDLOCK, NONE = "mount-namespace", "landlock", "none"
#: ``KVGRADER_FILE_VIEW=landlock`` or ``=none``: no better view than that.
VIEW_ENV = "KVGRADER_FILE_VIEW"
ORDER = (MOUNT_NAMESPACE, LANDLOCK, NONE)


@dataclass(frozen=True)
class WorkerView:
    """The view a grading's workers get, and why no better one."""

    kind: str
    reason: str = ""  # why not a tree of the worker's own ("" when it is one)

    @property
    def closes_tcp(self) -> bool:
        """Whether its rules close TCP to a worker that has no network namespace."""
        return self.kind == LANDLOCK and abi_version() >= 4

    @property
    def warning(self) -> str:
        """What the run's warnings say of it: only a worker with no view of its own."""
        if self.kind != NONE:
            return ""
        return f"the worker sees the machine's files, closed by permissions alone: {self.reason}"


def _asked() -> str:
    """The least view ``KVGRADER_FILE_VIEW`` allows (the best where unset or unknown)."""
    asked = os.environ.get(VIEW_ENV, "").strip().lower()
    return asked if asked in ORDER else MOUNT_NAMESPACE


def worker_view(dropped: bool = True) -> WorkerView:
    """The view this machine gives a worker that runs as a worker account (``dropped``:
    a root grader); a grader that is not root gives its workers none."""
    if not dropped:
        return WorkerView(NONE, "the grader is not root, and its worker runs as its user")
    asked = ORDER.index(_asked())
    why = f"{VIEW_ENV}={_asked()}"
    if asked <= 0:
        why = mount_isolation()
        if not why:
            return WorkerView(MOUNT_NAMESPACE)
    if asked <= 1:
        if abi_version() >= 1:
            return WorkerView(LANDLOCK, why)
        why = f"{why}; and the kernel offers no Landlock"
    return WorkerView(NONE, why)


def interpreter() -> list[Path]:
    """The folders of the interpreter the workers run (the venv and the one it is made from)."""
    return [Path(sys.prefix), Path(sys.base_prefix)]


def with_view(
    spec: Confinement, sandbox_root: Path, hidden: list[Path], *, offline: bool = True
) -> Confinement:
    """``spec`` with the view :func:`worker_view` gives, for the worker of the sandbox
    ``sandbox_root``, ``hidden`` covered (the checkout, an export); ``spec`` itself for a
    worker that runs as the grader's own user (``spec.uid`` None). A worker meant to be
    ``offline`` that got no network namespace gets Landlock's TCP rule with its files'."""
    if spec.uid is None:
        return spec
    kind = worker_view().kind
    if kind == MOUNT_NAMESPACE:
        mounts = plan_for(sandbox_root, hidden, interpreter())
        return dataclasses.replace(spec, mounts=mounts, landlock=None)
    if kind == LANDLOCK:
        seen = visible(str(sandbox_root), [str(p) for p in hidden], list(map(str, interpreter())))
        rules = rules_for(seen, close_tcp=offline and not spec.isolate_network)
        return dataclasses.replace(spec, mounts=None, landlock=rules)
    return dataclasses.replace(spec, mounts=None, landlock=None)
