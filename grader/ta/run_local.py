"""``python -m grader run-local``: run the autograder zip exactly as Gradescope runs it.

What Gradescope does, and so what this does:

* the zip is unpacked into ``ROOT/source``; ``setup.sh`` runs from there, as root,
  and builds the image: here with ``--no-system`` (no apt-get), so it makes the
  image's virtual environment from the zip's lock with this machine's
  ``python3.11``, kept in a cache folder between runs and rebuilt when the lock
  changes, never the project's own editable install;
* ``run_autograder`` is copied to ``ROOT/run_autograder`` and that copy is run,
  from ``ROOT``, with a bare environment (no ``PYTHONPATH``, no virtualenv);
* the student's files are in ``ROOT/submission``, ``ROOT/submission_metadata.json``
  describes the submission, and ``ROOT/results/results.json`` is read back and kept
  at ``results/run-local/results.json`` (the tree itself is removed unless ``--keep``).

Each step says what it does as it starts and how long it took (:class:`Step`): a cold
``setup.sh`` installs the image's packages for minutes, a warm one only checks them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from grader.core.paths import PROJECT_ROOT
from grader.core.results import GradingResults, validate_results
from grader.ta.freshness import Step

#: Where run-local keeps the image's virtual environment between runs. It must
#: be reachable by the worker user, which runs the same interpreter.
IMAGE_VENV = PROJECT_ROOT / ".image-venv"
#: Where the results of the last run-local are kept (``results/`` is git-ignored).
KEPT_RESULTS = PROJECT_ROOT / "results" / "run-local" / "results.json"
#: The environment Gradescope gives ``run_autograder``: nothing of ours.
BARE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Settings of ``setup.sh`` a TA may pass through (see its header).
PASSED_THROUGH = ("KVGRADER_TORCH_INDEX", "KVGRADER_BASE_PYTHON", "http_proxy", "https_proxy")


class SetupFailed(RuntimeError):
    """``setup.sh`` failed: the image Gradescope would build is broken."""


def metadata(previous: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``submission_metadata.json`` in Gradescope's documented shape."""
    return {
        "id": 1,
        "created_at": datetime.now(UTC).isoformat(),
        "assignment": {"title": "KV caching", "total_points": "0", "id": 1},
        "submission_method": "upload",
        "users": [{"email": "student@example.edu", "id": 1, "name": "Local Student"}],
        "previous_submissions": previous or [],
    }


def unpack(zip_path: Path, tree: Path) -> Path:
    """Unzip like Gradescope does, keeping the executable bits; return the source folder."""
    source = tree / "source"
    with zipfile.ZipFile(zip_path) as zf:
        for info in zf.infolist():
            target = zf.extract(info, source)
            mode = info.external_attr >> 16
            if mode & 0o111:
                os.chmod(target, 0o755)
    return source


def bare_environment(venv: Path) -> dict[str, str]:
    """The environment of Gradescope's scripts: a system PATH, root's home, the venv's place."""
    env = {
        "PATH": BARE_PATH,
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "KVGRADER_VENV": str(venv),
        "KVGRADER_PIP_CACHE": "1",
    }
    env.update({k: os.environ[k] for k in PASSED_THROUGH if k in os.environ})
    return env


def build_image(source: Path, env: dict[str, str], timeout_s: float = 1800) -> None:
    """Run the zip's ``setup.sh`` without apt-get; raise :class:`SetupFailed` with its output."""
    proc = subprocess.run(
        ["bash", str(source / "setup.sh"), "--no-system"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise SetupFailed(f"setup.sh exited with status {proc.returncode}:\n{tail}")


def run_local(
    *,
    submission: Path,
    zip_path: Path,
    keep: bool = False,
    previous: list[dict[str, Any]] | None = None,
    timeout_s: float = 900,
    venv: Path = IMAGE_VENV,
    kept: Path | None = KEPT_RESULTS,
) -> tuple[GradingResults, Path]:
    """Grade ``submission`` with the autograder zip; return the results and the tree used.
    The results file is copied to ``kept`` (None: not kept) before the tree is removed."""
    tree = Path(tempfile.mkdtemp(prefix="gradescope-")) / "autograder"
    try:
        source = unpack(zip_path, tree)
        env = bare_environment(venv)
        with Step(f"building the image: setup.sh (its venv kept in {venv})"):
            build_image(source, env)
        shutil.copy2(source / "run_autograder", tree / "run_autograder")
        shutil.copytree(submission, tree / "submission", symlinks=True)
        (tree / "results").mkdir()
        (tree / "submission_metadata.json").write_text(json.dumps(metadata(previous), indent=1))
        with Step(f"grading {submission}: run_autograder"):
            subprocess.run([str(tree / "run_autograder")], cwd=tree, env=env, timeout=timeout_s)
        data = json.loads((tree / "results" / "results.json").read_text())
        validate_results(data)
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / "results" / "results.json", kept)
        return GradingResults.from_gradescope(data), tree
    finally:
        if not keep:
            shutil.rmtree(tree.parent, ignore_errors=True)
