"""``python -m grader run-local``: run the autograder zip exactly as Gradescope would.

The zip is unpacked into a temporary Gradescope-shaped tree
(``autograder/{source,submission,results}`` and ``submission_metadata.json``),
``setup.sh``'s user and permission steps run (not its package installs: this
machine already has the packages), then ``run_autograder`` grades the copy of
the submission, and its ``results.json`` is read back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grader.results import GradingResults, TestResult, validate_results


def metadata(previous: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``submission_metadata.json`` in Gradescope's documented shape."""
    return {
        "id": 1,
        "created_at": datetime.now(timezone.utc).isoformat(),
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


def run_local(
    *,
    submission: Path,
    zip_path: Path,
    keep: bool = False,
    previous: list[dict[str, Any]] | None = None,
    timeout_s: float = 900,
) -> tuple[GradingResults, Path]:
    """Grade ``submission`` with the autograder zip; return the results and the tree used."""
    tree = Path(tempfile.mkdtemp(prefix="gradescope-")) / "autograder"
    try:
        source = unpack(zip_path, tree)
        shutil.copytree(submission, tree / "submission", symlinks=True)
        (tree / "results").mkdir()
        (tree / "submission_metadata.json").write_text(json.dumps(metadata(previous), indent=1))
        env = {**os.environ, "AUTOGRADER_ROOT": str(tree), "KVGRADER_PYTHON": sys.executable}
        if os.geteuid() == 0:
            subprocess.run(["bash", "setup.sh", "--only-user"], cwd=source, check=True, env=env,
                           stdout=subprocess.DEVNULL)  # fmt: skip
        subprocess.run(["bash", "run_autograder"], cwd=source, env=env, timeout=timeout_s)
        data = json.loads((tree / "results" / "results.json").read_text())
        validate_results(data)
        results = GradingResults(
            tests=[TestResult.from_gradescope(t) for t in data.get("tests", [])],
            output=data.get("output", ""),
            execution_time=float(data.get("execution_time", 0.0)),
            extra_data=data.get("extra_data", {}),
        )
        if not results.tests:
            results.score_override = float(data.get("score", 0.0))
        return results, tree
    finally:
        if not keep:
            shutil.rmtree(tree.parent, ignore_errors=True)
