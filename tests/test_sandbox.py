"""The worker runs as an unprivileged user with limits, and sees none of the parent's env."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grader.sandbox import Sandbox, resolve_identity
from tests.conftest import in_param_count, refused

ROOT_ONLY = os.geteuid() == 0


def test_environment_is_built_from_scratch(monkeypatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    box = Sandbox.create()
    try:
        env = box.environment("cpu", 2)
        assert "SECRET_TOKEN" not in env
        assert env["HOME"].startswith(str(box.root))
        assert env["OMP_NUM_THREADS"] == "2"
        assert env["HF_HUB_OFFLINE"] == "1"
    finally:
        box.cleanup()


@pytest.mark.skipif(not ROOT_ONLY, reason="dropping privileges needs root")
def test_root_grader_drops_to_an_unprivileged_worker() -> None:
    identity = resolve_identity()
    assert identity.dropped
    assert identity.uid != 0


@pytest.mark.skipif(ROOT_ONLY, reason="only meaningful when not root")
def test_non_root_grader_warns_that_it_cannot_drop() -> None:
    identity = resolve_identity()
    assert not identity.dropped
    assert "not running as root" in identity.warning


@pytest.mark.skipif(not ROOT_ONLY, reason="dropping privileges needs root")
def test_worker_cannot_read_root_only_files(grade_patched, tmp_path: Path) -> None:
    secret = tmp_path / "hidden.json"
    secret.write_text("42")
    secret.chmod(0o600)
    graded = grade_patched([in_param_count(f"    open({str(secret)!r}).read()")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))


@pytest.mark.skipif(not ROOT_ONLY, reason="dropping privileges needs root")
def test_worker_cannot_write_the_results_folder(grade_patched, tmp_path: Path) -> None:
    target = tmp_path / "out" / "results.json"
    graded = grade_patched([in_param_count(f"    open({str(target)!r}, 'w').write('{{}}')")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))
    assert graded.data["tests"]  # the real file, not the forged one


@pytest.mark.skipif(not ROOT_ONLY, reason="creating a user needs root")
def test_setup_script_creates_the_worker_user_that_the_grader_then_uses() -> None:
    import pwd
    import subprocess

    from grader.sandbox import PROJECT_GRADESCOPE

    name = "kvgrader-selftest"
    script = PROJECT_GRADESCOPE / "create_worker_user.sh"
    try:
        subprocess.run(["bash", str(script), name], check=True, capture_output=True)
        subprocess.run(["bash", str(script), name], check=True, capture_output=True)  # idempotent
        entry = pwd.getpwnam(name)
        identity = resolve_identity(preferred=name)
        assert identity.dropped
        assert (identity.name, identity.uid) == (name, entry.pw_uid)
        assert identity.warning == ""
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.mark.skipif(not ROOT_ONLY, reason="dropping privileges needs root")
def test_worker_cannot_read_the_hidden_test_cases(grade_patched) -> None:
    from grader.context import TEST_CASES

    hidden = TEST_CASES / "hidden" / "part1.json"
    graded = grade_patched([in_param_count(f"    open({str(hidden)!r}).read()")])
    assert graded.score("1.1") == 0
    assert refused(graded.output("1.1"))
    assert 0 < graded.score("1.12") < 2  # the hidden checks still ran, from the parent
