"""Root never touches what the student made: the reference solution, timed in the same
grading as the yardstick of 2.11, 3.7, 3.11 and 4.6, runs as an account of its own with a
home, temporary folder and caches of its own, so a link or a FIFO the submission leaves
on its worker's paths is neither followed nor opened by it; and a yardstick that cannot
be measured is the grader's fault, bounded, and never costs the student points."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import time
from pathlib import Path

import pytest

from grader.judging import yardstick
from grader.runtime.client import WorkerClient
from grader.runtime.outcomes import SubmissionError
from grader.sandbox.sandbox import TRUSTED_USER, Sandbox
from tests.conftest import (
    ATTACK,
    FAST_LIMITS,
    SOLUTION,
    in_param_count,
    patched_solution,
    run_grade,
)

ROOT_ONLY = pytest.mark.needs_root(reason="needs a root grader")
PARTS = ["part1", "part3"]

#: A Part 1 that leaves links where the reference's libraries keep their caches when they
#: share the worker's ``TMPDIR`` and ``HOME``: tiktoken's ``$TMPDIR/data-gym-cache``, the
#: ``~/.cache`` and ``~/.config`` of most others, each to a folder the worker cannot write.
LINKS = """\
    import os as _os
    for _base, _name, _to in ((_os.environ["TMPDIR"], "data-gym-cache", {secret!r}),
                              (_os.environ["HOME"], ".cache", {results!r}),
                              (_os.environ["HOME"], ".config", {secret!r})):
        _path = _os.path.join(_base, _name)
        if not _os.path.lexists(_path):
            _os.symlink(_to, _path)"""
#: The same places as FIFOs: ``~/.cache`` and ``~/.config``, and in tiktoken's cache
#: folder the file its cache of Part 3's tokenizer (``data/tiny_llama/tokenizer.model`` in
#: the sandbox, a path the worker can tell) would be read from: an ``open`` of it blocks.
FIFOS = """\
    import hashlib as _hashlib, os as _os
    _cache = _os.path.join(_os.environ["TMPDIR"], "data-gym-cache")
    _model = _os.path.dirname(_os.environ["TMPDIR"]) + "/data/tiny_llama/tokenizer.model"
    _os.makedirs(_cache, exist_ok=True)
    for _path in (_os.path.join(_cache, _hashlib.sha1(_model.encode()).hexdigest()),
                  _os.path.join(_os.environ["HOME"], ".cache"),
                  _os.path.join(_os.environ["HOME"], ".config")):
        if not _os.path.lexists(_path):
            _os.mkfifo(_path)"""
#: The submission's own tokenizer keeps no cache, so that only a reader of the planted
#: FIFOs other than the submission blocks on them.
NO_OWN_CACHE = (
    "import tiktoken\n",
    "import os\n\nimport tiktoken\n\nos.environ['TIKTOKEN_CACHE_DIR'] = ''\n",
)


def _timed_scores(graded) -> dict[str, float]:
    return {n: graded.score(n) for n in ("3.7", "3.11")}


def _graded_with(tmp_path: Path, plant: str, secret: Path, results: Path):
    code = plant.format(secret=str(secret), results=str(results))
    submission = patched_solution(tmp_path / "submission", "question1.py", [in_param_count(code)])
    tokenizer = submission / "llama" / "tokenizer.py"
    text = tokenizer.read_text()
    assert text.count(NO_OWN_CACHE[0]) == 1
    tokenizer.write_text(text.replace(*NO_OWN_CACHE))
    began = time.monotonic()
    graded = run_grade(submission, results, parts=PARTS)
    return graded, time.monotonic() - began


@pytest.fixture(scope="module")
def unplanted(tmp_path_factory: pytest.TempPathFactory):
    """The same parts of the solution graded without a plant, and how long it took."""
    out = tmp_path_factory.mktemp("unplanted")
    began = time.monotonic()
    graded = run_grade(SOLUTION, out, parts=PARTS)
    return graded, time.monotonic() - began, sorted(os.listdir(out))


@ATTACK
@ROOT_ONLY
@pytest.mark.parametrize("plant", [LINKS, FIFOS], ids=["links", "fifos"])
def test_a_plant_on_the_workers_paths_is_never_touched_by_the_reference(
    tmp_path: Path, unplanted, plant: str
) -> None:
    secret = tmp_path / "root-only"  # a folder the worker account cannot even list
    secret.mkdir(mode=0o700)
    results = tmp_path / "results"
    results.mkdir()
    graded, seconds = _graded_with(tmp_path, plant, secret, results)
    plain, plain_seconds, plain_files = unplanted
    assert os.listdir(secret) == []  # nothing written through the link
    assert sorted(os.listdir(results)) == plain_files
    assert graded.part_score("part1") == plain.part_score("part1")  # the plant ran unseen
    assert _timed_scores(graded) == _timed_scores(plain)
    assert graded.score("3.11") == graded.test("3.11")["max_score"]
    assert "Grader fault" not in graded.output("3.11")
    # no reference session hung on a FIFO (each would cost a request's timeout)
    assert seconds < plain_seconds * 1.5 + 20


@ROOT_ONLY
def test_the_reference_runs_as_its_own_account_with_folders_of_its_own(tmp_path: Path) -> None:
    """A trusted worker: the trusted account (where the set-up created it), and a HOME,
    TMPDIR and MPLCONFIGDIR in a folder only it can enter, outside the submission's."""
    source = tmp_path / "reference"
    source.mkdir()
    shutil.copy(SOLUTION / "question1.py", source / "question1.py")
    with (source / "question1.py").open("a") as f:
        f.write(
            "\n\ndef whoami():\n    import os, tempfile\n"
            "    return '|'.join([str(os.getuid()), os.environ['HOME'], tempfile.gettempdir(),"
            " os.environ['MPLCONFIGDIR']])\n"
        )
    sandbox = Sandbox.create()
    try:
        sandbox.hand_over()
        base = sandbox.provide(source, "reference", private=True)
        client = WorkerClient(
            part="part1", module_file="question1.py", submission_dir=str(base),
            sandbox=sandbox, limits=FAST_LIMITS, trusted=True,
        )  # fmt: skip
        call = {"op": "call", "func": "whoami", "args": [], "kwargs": {}}
        uid, home, tmp, mpl = (
            client.request(call, what="whoami()").header["result"]["value"].split("|")
        )
        client.stop()
        own = sandbox.trusted_dir
        info = own.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700
        for path in (home, tmp, mpl):
            assert Path(path).is_relative_to(own)
            assert not Path(path).is_relative_to(sandbox.root / "tmp")
            assert not Path(path).is_relative_to(sandbox.root / "home")
        try:
            expected = pwd.getpwnam(TRUSTED_USER).pw_uid  # the set-up created it
        except KeyError:
            expected = 0  # no such account: root, with folders of its own still
        assert int(uid) == expected == info.st_uid
        assert base.stat().st_uid == expected  # its private copy is readable by it alone
        assert int(uid) != sandbox.identity.uid
    finally:
        sandbox.cleanup()


@ATTACK
def test_a_yardstick_that_cannot_be_measured_costs_the_student_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's timed runs fail every time: timed twice (a fresh trusted worker for
    the retry), never again in the grading; the checks are judged on the submission's own
    timings, their pages say it is the grader's fault, the record and the run's warnings
    flag it for the TA."""
    attempts: list[int] = []

    def failing(*args, **kwargs):
        attempts.append(1)
        raise SubmissionError("generate did not finish within 20 s and was stopped", "timeout")

    monkeypatch.setattr(yardstick, "until_steady", failing)
    graded = run_grade(SOLUTION, tmp_path / "out", parts=["part3"])
    assert len(attempts) == yardstick.ATTEMPTS
    for number in ("3.7", "3.11"):
        assert graded.score(number) == graded.test(number)["max_score"], graded.output(number)
        assert yardstick.NOT_MEASURED in graded.output(number)
    record = graded.data["extra_data"]["benchmarks"]["3.11"]
    assert "generate did not finish" in record["grader_fault"]
    assert any("reference" in label for label in record["undecided"])
    warnings = graded.data["extra_data"]["sandbox_warnings"]
    assert any("part3: the reference solution's timed runs failed" in w for w in warnings)
