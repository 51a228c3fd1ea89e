"""The student zip's Part 1 data holds no write-up answer, and its self-check still judges
them: the reference passes, a submission with wrong answers fails with the autograder's
messages and without the answers."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grader.core.feedback import escape
from grader.core.paths import TEST_CASES
from grader.core.points import POINTS
from grader.ta import dist as build
from grader.ta.mutants import load_mutants
from tests.conftest import SOLUTION, patched_solution, run_grade

pytestmark = pytest.mark.xdist_group("part1_student_zip")

TOP = "kv-cache-assignment"
ANSWERS: dict[str, dict[str, Any]] = json.loads((TEST_CASES / "hidden" / "part1.json").read_text())[
    "answers"
]
#: The public checks (all but the hidden-case ones 1.12 and 1.13).
PUBLIC_CHECKS = [n for n in POINTS["part1"] if n not in ("1.12", "1.13")]


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def unzipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``student.zip`` built from the committed cases and unpacked."""
    out = tmp_path_factory.mktemp("dist")
    path = build.build_student(out=out / "student.zip", check_cases=False)
    with zipfile.ZipFile(path) as zf:
        zf.extractall(out)
    return out / TOP


def scalars(value: Any) -> Iterator[int | float]:
    """The numbers of a value: itself, or a table's entries."""
    yield from value.values() if isinstance(value, dict) else [value]


def forms(value: int | float) -> set[str]:
    """The ways a number is written: JSON, with separators, as feedback rounds it."""
    if isinstance(value, int):
        return {str(value), f"{value:,}"}
    return {repr(value), f"{value:.6g}", f"{value:.4g}", f"{value:.2f}"}


def walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a JSON document with its path of keys."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*path, key))
    elif isinstance(node, list):
        for value in node:
            yield from walk(value, path)
    else:
        yield path, node


def test_the_zips_part1_cases_hold_no_answer_and_no_mistake_value(unzipped: Path) -> None:
    """No expected value (nor a known mistake's value, from which the answer follows) of a
    public case appears in the zip's part1.json: not as a number outside the calls'
    arguments (an input, such as the 8 GiB of a GPU, may equal a mistake's value), not in
    any string but the hex digests of the seals and the labels that name the inputs (a
    combination of four mistakes gives a batch of 1024, the context of "context 1024").
    The cases on inputs of their own hold their values in plain form by design; a small
    batch size there may equal a mistake's elsewhere."""
    document = json.loads((unzipped / "test_cases" / "public" / "part1.json").read_text())
    document["cases"] = [c for c in document["cases"] if not c.get("own_input")]
    numbers, strings = set(), []
    for path, leaf in walk(document):
        if "sealed" in path:
            assert isinstance(leaf, str) and len(leaf) == 64, path  # digests only
        elif "args" in path or "kwargs" in path or path[-1:] in (("label",), ("id",)):
            continue
        elif isinstance(leaf, str):
            strings.append(leaf)
        elif not isinstance(leaf, bool):
            numbers.add(leaf)
    secrets = [
        value
        for answer in ANSWERS.values()
        for whole in (answer["expected"], *answer["mistakes"].values())
        for value in scalars(whole)
    ]
    assert len(secrets) > 100
    for value in secrets:
        assert value not in numbers, value
        for form in forms(value):
            if len(form) >= 3:
                assert not any(form in s for s in strings), form


#: A number as prose and code write it: digits with optional separators, a fraction, an
#: exponent ("134,217,728", "520.4", "1e9"), not part of a name or a longer number.
NUMBER = re.compile(r"(?<![\w.])\d[\d,_]*(?:\.\d+)?(?:[eE][+-]?\d+)?")
#: What people write: the handout, code and its comments, settings. The zip's data files
#: (random draws, token ids, measured times) are numbers by the thousand; part1.json is
#: searched by the test above.
WRITTEN = (".md", ".py", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".sh", ".html")


def sealed_values() -> set[int | float]:
    """Every expected value of a public case that is sealed (all but inputs of their own)."""
    public = json.loads((TEST_CASES / "public" / "part1.json").read_text())["cases"]
    ids = [c["id"] for c in public if not c.get("own_input")]
    return {v for i in ids for v in scalars(ANSWERS[i]["expected"]) if not isinstance(v, bool)}


def gives_away(written: float, secret: int | float) -> bool:
    """Whether a number written in a file shows ``secret``: a whole answer of three digits
    or more by its integer part (``520.4`` as a "fractional batch size" gives 520), any
    other by its value to four significant digits."""
    if float(secret).is_integer() and abs(secret) >= 100:
        return math.floor(written) == secret
    return secret != 0 and abs(written - secret) <= 1e-4 * abs(secret)


def test_nothing_written_in_the_student_zip_shows_a_sealed_answer(unzipped: Path) -> None:
    """No file a student receives (the handout, the skeletons, the self-check and the grader
    code it carries) writes a sealed Part 1 answer as a number, not even as an example of
    what is accepted: the seals would be for nothing."""
    secrets = sealed_values()
    assert len(secrets) > 10
    found = []
    for path in sorted(p for p in unzipped.rglob("*") if p.suffix in WRITTEN):
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in NUMBER.finditer(text):
            written = float(match.group().replace(",", "").replace("_", ""))
            if math.isfinite(written) and any(gives_away(written, s) for s in secrets):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(unzipped)}:{line}: {match.group()}")
    assert not found, found


def selfcheck(home: Path, question1: Path) -> dict[str, dict[str, Any]]:
    """Run the zip's self-check on Part 1 with ``question1`` as the student's file."""
    (home / "assignment" / "question1.py").write_bytes(question1.read_bytes())
    subprocess.run(
        [sys.executable, "selfcheck.py", "assignment", "--parts", "part1"],
        cwd=home,
        capture_output=True,
        timeout=300,
        check=True,
    )
    results = json.loads((home / "selfcheck_results.json").read_text())
    return {t["number"]: t for t in results["tests"]}


def test_the_selfcheck_passes_the_reference_on_the_sealed_cases(unzipped: Path) -> None:
    tests = selfcheck(unzipped, SOLUTION / "question1.py")
    assert sorted(tests) == sorted(PUBLIC_CHECKS)
    assert all(t["score"] == t["max_score"] > 0 for t in tests.values()), tests


def test_wrong_answers_fail_with_the_autograders_messages_and_never_the_answer(
    unzipped: Path, tmp_path: Path
) -> None:
    """Two known mistakes at once (the TP batch, an int; the prefill bytes, a float): the
    self-check fails exactly the checks the autograder fails, with the same feedback
    (the mistakes named), and the right values appear nowhere in it."""
    mistakes = {m.name: m for m in load_mutants("part1")}
    chosen = [mistakes["tp_weights_replicated"], mistakes["s_p_not_round_tripped"]]
    edits = [edit for m in chosen for edit in m.edits]
    submission = patched_solution(tmp_path / "submission", "question1.py", edits)
    local = selfcheck(unzipped, submission / "question1.py")
    official = run_grade(submission, tmp_path / "official", parts=["part1"])

    failed = {n for n, t in local.items() if t["score"] < t["max_score"]}
    assert failed == {"1.5", "1.7", "1.8", "1.10"}
    for number in PUBLIC_CHECKS:
        # On Gradescope checks 1.1 to 1.7 also run one hidden input each: its lines (its
        # table rows) and the count of more failing cases are the only difference.
        def public(text: str) -> list[str]:
            return [x for x in text.splitlines() if not x.startswith("*(and ")]

        shown = [x for x in public(official.shown(number)) if "(hidden input)" not in x]
        assert public(local[number].get("output", "")) == shown, number
        assert local[number]["score"] == official.score(number), number
    assert escape(chosen[0].diagnosis) in local["1.5"]["output"]
    assert escape(chosen[1].diagnosis) in local["1.7"]["output"]
    assert "max_batch_size_tp = 1,040 (compared exactly)" in local["1.10"]["output"]

    wrong = [
        answer["expected"]
        for cid, answer in ANSWERS.items()
        if cid.startswith("1.5 ")
        or cid in ("1.7 N=1024, d=128, prefill", "1.8 N=1024, d=128, prefill")
    ]
    table = ANSWERS["1.10 defaults"]["expected"]
    wrong += [table["max_batch_size_tp"], table["ai_prefill"]]
    assert len(wrong) == 7
    text = "\n".join(local[n].get("output", "") for n in failed)
    for value in wrong:
        for form in forms(value):
            assert form not in text, form


def test_a_build_refuses_plain_answers_in_the_public_part1_cases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Public Part 1 cases as they were before sealing (expected values in plain form)
    stop the student zip from being built."""
    assert build.plain_answers(TEST_CASES / "public") == []
    public = tmp_path / "test_cases" / "public"
    public.mkdir(parents=True)
    document = json.loads((TEST_CASES / "public" / "part1.json").read_text())
    case = document["cases"][0]
    answer = ANSWERS[case.pop("id")]
    del case["sealed"]
    document["cases"] = [{**case, **answer}]
    (public / "part1.json").write_text(json.dumps(document))
    assert build.plain_answers(public) == ["1.1 LLaMA-3-8B"]
    monkeypatch.setattr(build, "TEST_CASES", tmp_path / "test_cases")
    with pytest.raises(build.PlainAnswers, match=r"1\.1 LLaMA-3-8B"):
        build.build_student(out=tmp_path / "student.zip", check_cases=False)
    assert not (tmp_path / "student.zip").exists()
