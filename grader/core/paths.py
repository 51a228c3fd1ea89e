"""Every path of the project and every copy-ignore list, defined once.

Folders that exist only in a checkout (``solution/``, ``assignment/``, ``docs/``) are
named here too; the autograder zip simply lacks them, and code that needs them is TA-side.
"""

from __future__ import annotations

from pathlib import Path

#: The ``grader`` package folder.
PACKAGE = Path(__file__).resolve().parent.parent
#: The checkout (or the unpacked zip's ``source/``): the folder holding ``grader/``.
PROJECT_ROOT = PACKAGE.parent
TEST_CASES = PROJECT_ROOT / "test_cases"
SOLUTION = PROJECT_ROOT / "solution"
ASSIGNMENT = PROJECT_ROOT / "assignment"
RESULTS = PROJECT_ROOT / "results"
REQUIREMENTS = PROJECT_ROOT / "requirements"
#: The worker's scripts, copied into each sandbox.
WORKER_SOURCE = PACKAGE / "worker"
#: The parts' folders: each one's ``adapter.py`` joins the worker scripts as
#: ``adapter_<part>.py``, and an ``adapter_<name>.py`` beside it as ``adapter_<part>_<name>.py``.
PARTS_SOURCE = PACKAGE / "parts"
#: Files that run at the top of the zips: Gradescope's set-up and entry point, the
#: student's self-check.
GRADESCOPE_FILES = PACKAGE / "gradescope"
#: Creates the pool of unprivileged worker accounts (run by the image's set-up).
WORKER_ACCOUNTS_SCRIPT = PACKAGE / "sandbox" / "create_worker_user.sh"
#: The mutant library, one file per part (TA tooling).
MUTANT_LIBRARY = PACKAGE / "ta" / "mutants"

#: Never copied anywhere: caches and generated output.
CACHE_PATTERNS = ("__pycache__", "*.pyc", ".DS_Store")
#: Copies of solution/ (mutants, mutation shards) leave out generated plots and results.
SOLUTION_COPY_PATTERNS = (*CACHE_PATTERNS, "*.png", "*.json", "results*")
#: Files never shipped in a zip.
DIST_PATTERNS = (*CACHE_PATTERNS, "*.png", "results", "benchmark_results.json")
