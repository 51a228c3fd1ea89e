"""Whether the committed test cases match ``solution/``, checked once per content.

``regen --check`` regenerates every case in a scratch folder and compares: the slow step
of ``make dist`` and ``make run-local``. Its answer depends only on the files it reads:
``solution/``, the skeletons in ``assignment/``, the committed ``test_cases/`` and the
grader code that builds and compares cases (the modules ``grader.ta.regen`` imports,
directly or not, and the data files beside them). A passed check is recorded under
``dist/`` with a digest of those files, so a second build of the same content (the other
zip, ``run-local`` after ``make dist``) says so and skips it; any change to those files
checks again.

Each step a TA waits for says what it does as it starts, and how long it took: a line
per step, with a line every few seconds while a long one runs (:class:`Step`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from grader.core.paths import ASSIGNMENT, PACKAGE, PROJECT_ROOT, SOLUTION, TEST_CASES

#: Where a passed check is recorded (``dist/`` is git-ignored build output).
CHECK_RECORD = PROJECT_ROOT / "dist" / ".cases-checked.json"
#: The module whose import closure builds and compares the cases.
CHECK_MODULE = "grader.ta.regen"
#: Never inputs: what running code leaves behind.
SKIPPED = ("__pycache__", ".pyc", ".png")


class StaleCases(RuntimeError):
    """The committed test cases no longer match solution/ (run ``python -m grader regen``)."""


def _files_under(root: Path, *, deep: bool = True) -> list[Path]:
    """The files under ``root`` (only those directly in it unless ``deep``), sorted, without
    what running code leaves behind."""
    found = root.rglob("*") if deep else root.glob("*")
    return sorted(
        p
        for p in found
        if p.is_file() and not any(part.endswith(SKIPPED) for part in p.relative_to(root).parts)
    )


def check_code() -> list[Path]:
    """The grader's files the check runs: every module :data:`CHECK_MODULE` imports,
    directly or not (imports inside functions included), and the data files (``.toml``,
    ``.json``) in the folders that hold them."""
    import grimp

    graph = grimp.build_graph("grader", cache_dir=None)
    modules = {CHECK_MODULE} | graph.find_upstream_modules(CHECK_MODULE)
    files = set()
    for module in modules:
        path = PACKAGE.parent / module.replace(".", "/")
        files.add(
            path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        )
    for folder in {f.parent for f in files}:
        for data in _files_under(folder):
            inside = data.relative_to(folder).parents
            in_package = any((folder / d / "__init__.py").is_file() for d in inside if d.parts)
            if data.suffix != ".py" and not in_package:
                files.add(data)
    return sorted(files)


def _inputs() -> Iterator[Path]:
    """Every file the check reads, in a fixed order."""
    for root in (SOLUTION, ASSIGNMENT, TEST_CASES):
        yield from _files_under(root)
    yield from check_code()


def content_digest() -> str:
    """A SHA-256 over the names and bytes of every file the check reads."""
    digest = hashlib.sha256()
    for path in _inputs():
        digest.update(path.relative_to(PROJECT_ROOT).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def checked_before(digest: str, record: Path = CHECK_RECORD) -> bool:
    """Whether a check of this very content passed before."""
    try:
        return json.loads(record.read_text()).get("digest") == digest
    except (OSError, ValueError):
        return False


class Step:
    """One step a TA waits for: its name as it starts, a line every ``every_s`` seconds
    while it runs, and its time when it ends (``with Step("checking ..."):``)."""

    def __init__(self, what: str, *, every_s: float = 10.0, file: IO | None = None) -> None:
        self.what, self.every_s, self.file = what, every_s, file or sys.stdout
        self.started = 0.0
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None

    def say(self, text: str) -> None:
        """A line now, flushed (``make dist > log`` shows it at once)."""
        print(text, file=self.file, flush=True)

    def _tick(self) -> None:
        while not self._done.wait(self.every_s):
            self.say(f"  ... {self.what}: {time.monotonic() - self.started:.0f} s so far")

    def __enter__(self) -> Step:
        self.started = time.monotonic()
        self.say(f"{self.what} ...")
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, kind: type | None, *_: object) -> None:
        self._done.set()
        if self._ticker is not None:
            self._ticker.join()
        ended = "done" if kind is None else "stopped"
        self.say(f"{self.what}: {ended} in {time.monotonic() - self.started:.1f} s")


def ensure_fresh_cases(file: IO | None = None, record: Path | None = None) -> None:
    """Raise :class:`StaleCases` unless the cases match ``solution/``: checked by
    regenerating them, or known from a passed check of the same content (then said).
    ``record``: where passed checks are recorded (default :data:`CHECK_RECORD`)."""
    from grader.ta import regen

    out, record = file or sys.stdout, record or CHECK_RECORD
    digest = content_digest()
    if checked_before(digest, record):
        print(f"test cases: up to date (checked before for this content, {digest[:12]})",
              file=out, flush=True)  # fmt: skip
        return
    with Step("checking the test cases against solution/ (regenerated in a scratch folder)",
              file=out):  # fmt: skip
        problems = regen.check()
    if problems:
        raise StaleCases("stale test cases:\n  " + "\n  ".join(problems))
    record_fresh(digest, record)


def record_fresh(digest: str | None = None, record: Path | None = None) -> None:
    """Record that the cases match ``solution/`` for this content: after a passed check,
    or after ``regen`` wrote every case (then a build that follows need not check)."""
    record = record or CHECK_RECORD
    record.parent.mkdir(parents=True, exist_ok=True)
    digest = digest or content_digest()
    record.write_text(json.dumps({"digest": digest, "checked_at": time.time()}) + "\n")
