"""``python -m grader similarity``: planted copies rank first, the untouched skeleton
scores nothing, and student files are read, never followed out of their folder."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from pathlib import Path

import pytest

from grader import cli
from grader.ta import similarity
from tests.conftest import SOLUTION
from tests.ta.similarity_factory import (
    COPIED,
    HOSTILE_FILE,
    HOSTILE_FOLDER,
    OUTSIDE,
    build_hostile_export,
    build_similarity_export,
    disguised,
)

COPIES = {"original", "verbatim", "disguised"}


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], Path]:
    export = tmp_path_factory.mktemp("export")
    roles = build_similarity_export(export, independent=10)
    out = tmp_path_factory.mktemp("similarity")
    assert cli.main(["similarity", str(export), "--out", str(out)]) == 0
    return roles, out


def ranked(out: Path) -> list[dict[str, str]]:
    with open(out / "similarity.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_planted_copies_rank_first(compared) -> None:
    roles, out = compared
    rows = ranked(out)
    top = [{roles[r["first"]], roles[r["second"]]} for r in rows[:3]]
    assert all(pair <= COPIES for pair in top), rows[:4]  # the three pairs among the copies
    assert float(rows[2]["score"]) > 0.5  # the disguised copy is still found
    assert all(float(r["score"]) < 0.2 for r in rows[3:])  # nobody else comes near


def test_the_skeleton_alone_scores_near_zero(compared) -> None:
    roles, out = compared
    with open(out / "similarity_by_submission.csv", newline="") as f:
        highest = {r["submission"]: float(r["highest_score"]) for r in csv.DictReader(f)}
    assert set(highest) == set(roles)
    for folder, role in roles.items():
        assert (highest[folder] > 0.5) == (role in COPIES), (folder, role)
    skeleton = next(f for f, role in roles.items() if role == "skeleton")
    assert highest[skeleton] < 0.05


def test_the_reports_say_how_to_read_them_and_highlight_the_matches(compared) -> None:
    _, out = compared
    md = (out / "similarity.md").read_text()
    assert "never a verdict" in md
    assert "| 1 | Student 1 (submission_1) | Student 2 (submission_2) | 1.00 |" in md
    page = (out / "similarity.html").read_text()
    assert "question1.py" in page and "<span" in page  # copydetect's highlighted regions


def test_a_pair_is_named_by_its_students_with_every_file_it_shares(compared) -> None:
    _, out = compared
    top = ranked(out)[0]
    assert (top["first_names"], top["second_names"]) == ("Student 1", "Student 2")
    shared = [f.rsplit(" ", 1) for f in top["files"].split("; ")]
    assert sorted(name for name, _ in shared) == sorted(COPIED)  # both copied files, scored
    assert all(float(score) > 0.9 for _, score in shared)
    md = (out / "similarity.md").read_text()
    assert "question1.py 1.00" in md and "transformer_skeleton.py 1.00" in md


def test_the_page_opens_on_the_ranked_pairs_not_a_file_matrix(compared) -> None:
    _, out = compared
    page = (out / "similarity.html").read_text()
    assert "Similarity Matrix" not in page and "<img" not in page  # copydetect's stock page
    assert "cdn.jsdelivr" not in page and "<script" not in page  # one offline file
    ranking, code = page.index('<table id="pairs">'), page.index("<pre>")
    assert ranking < code  # the ranking first, then the code
    first_row = page[ranking:].split("</tr>")[1]
    assert "Student 1" in first_row and "Student 2" in first_row
    assert first_row.count('href="#pair-1-') == len(COPIED)  # every shared file, linked
    assert 'id="pair-1-2"' in page  # ... to its copies side by side


def test_a_submission_with_nothing_of_its_own_is_named_not_left_out(compared) -> None:
    """The untouched skeleton is in no pair: both reports say so by name, and the page
    says how many pairs it ranks of how many."""
    roles, out = compared
    skeleton = next(f for f, role in roles.items() if role == "skeleton")
    page, md = (out / "similarity.html").read_text(), (out / "similarity.md").read_text()
    assert skeleton not in {r[k] for r in ranked(out) for k in ("first", "second")}
    note = page.split('id="not-compared">', 1)[1].split("</p>", 1)[0]
    assert note.startswith("In no pair (1):") and skeleton in note
    assert f"In no pair (1): Student {skeleton.rsplit('_', 1)[1]} ({skeleton})" in md
    total = len(ranked(out))
    assert total > similarity.TOP_PAIRS  # the page ranks the top of them
    assert f"the {similarity.TOP_PAIRS} highest of {total} pairs that share a file" in page


def test_each_copy_opens_at_its_matching_code(compared) -> None:
    """A copy is shown from a few lines before its first match, not from its first line:
    the match is on the pane's first screen."""
    _, out = compared
    page = (out / "similarity.html").read_text()
    panes = page.split("<pre>")[1:]
    assert panes
    for pane in panes:
        code = pane.split("</pre>", 1)[0]
        before = code.split("<span class='highlight-", 1)[0]
        assert before.count("\n") <= 11, before[-400:]


def test_the_folder_the_export_was_unzipped_into_is_compared(tmp_path: Path) -> None:
    export = tmp_path / "unzipped" / "assignment_7_export"
    build_similarity_export(export, independent=0)
    out = tmp_path / "out"
    assert cli.main(["similarity", str(tmp_path / "unzipped"), "--out", str(out)]) == 0
    assert ranked(out)[0]["first"] == "submission_1"


def test_files_uploaded_flat_or_in_folders_are_compared_as_the_same_file(tmp_path: Path) -> None:
    """The handout lets a student upload Part 3 flat (``model.py``) or in folders
    (``assignment/llama/model.py``), or some of each: the grader takes all as
    ``llama/model.py``, and so does the comparison, so a copy is found however it was
    uploaded."""
    export = tmp_path / "export"
    folders = ("submission_1", "submission_2", "submission_3", "submission_4")
    for folder in folders:
        (export / folder).mkdir(parents=True)
    (export / "submission_1" / "llama").mkdir()
    (export / "submission_3" / "assignment" / "llama").mkdir(parents=True)
    (export / "submission_4" / "llama").mkdir()
    for name in ("model.py", "generation.py"):
        code = (SOLUTION / "llama" / name).read_text()
        (export / "submission_1" / "llama" / name).write_text(code)
        (export / "submission_2" / name).write_text(code)  # flat
        (export / "submission_3" / "assignment" / "llama" / name).write_text(code)
        mixed = "llama/model.py" if name == "model.py" else name  # generation.py flat
        (export / "submission_4" / mixed).write_text(code)
    out = tmp_path / "out"
    assert cli.main(["similarity", str(export), "--out", str(out)]) == 0
    pairs = {(r["first"], r["second"]): r for r in ranked(out)}
    assert set(pairs) == {(a, b) for i, a in enumerate(folders) for b in folders[i + 1 :]}
    for row in pairs.values():
        assert row["files"] == "llama/generation.py 1.00; llama/model.py 1.00", row


def test_the_disguise_renames_and_reorders_but_keeps_the_code() -> None:
    source = "def a(x):\n    y = x + 1\n    return y\n\n\ndef b(z):\n    return a(z)\n"
    text = disguised(source)
    assert text.index("def f1") < text.index("def f0")  # b before a
    assert "x" not in text.replace("def", "") and "v0 + 1" in text


def test_links_and_large_files_are_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "submission_1"
    folder.mkdir()
    (folder / "question1.py").write_text("x = 1\n")
    (folder / "secret.py").symlink_to("/etc/passwd")
    os.symlink(tmp_path, folder / "loop")
    (folder / "big.py").write_text("#" * (similarity.MAX_FILE_BYTES + 1))
    assert list(similarity.code_files(folder)) == ["question1.py"]


def test_a_submission_of_many_files_is_compared_on_its_assignment_files_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "submission_1"
    (folder / "vendored").mkdir(parents=True)
    (folder / "question1.py").write_text("def param_count(spec):\n    return 1\n")
    for i in range(similarity.MAX_SUBMISSION_FILES + 5):
        (folder / "vendored" / f"m{i:03}.py").write_text(f"x = {i}\n")
    owner = similarity.stage([folder], tmp_path / "scratch", {})
    names = [s.rel for s in owner.values()]
    assert len(names) == similarity.MAX_SUBMISSION_FILES and "question1.py" in names
    assert "submission_1: 6 code files not compared" in capsys.readouterr().err


def test_a_missing_export_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["similarity", str(tmp_path / "absent")]) == 2
    assert "is not a folder" in capsys.readouterr().err


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    export, outside = tmp_path_factory.mktemp("export"), tmp_path_factory.mktemp("outside")
    build_hostile_export(export, outside)
    out, err = tmp_path_factory.mktemp("similarity"), io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(["similarity", str(export), "--out", str(out)]) == 0
    return out, err.getvalue()


def pages(out: Path) -> dict[str, str]:
    """The pages a TA opens in a browser or a Markdown viewer (the CSV files are data: they
    hold each name as it is)."""
    return {p.name: p.read_text() for p in sorted(out.iterdir()) if p.suffix in (".html", ".md")}


def test_student_names_and_code_are_escaped_exactly_once_in_every_page(hostile) -> None:
    out, _ = hostile
    written = pages(out)
    html, md = written["similarity.html"], written["similarity.md"]
    for raw in (HOSTILE_FILE, HOSTILE_FOLDER):
        once = raw.replace("<", "&lt;").replace(">", "&gt;")
        assert once in html and once in md, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the student's line of code
    assert "<span class='highlight-red'>" in html  # copydetect's own markup is kept
    for name, text in written.items():
        assert "<img src=x" not in text and "<svg" not in text, name  # the page's own <img>s
        assert "<script>alert" not in text, name  # have a src="data:..."
        assert "&amp;lt;" not in text and "&amp;gt;" not in text, name  # never twice


def test_links_out_of_the_export_are_skipped_and_named(hostile) -> None:
    out, err = hostile
    assert "submission_9 is skipped: it is a link" in err
    for name in (
        "similarity.html",
        "similarity.md",
        "similarity.csv",
        "similarity_by_submission.csv",
    ):
        text = (out / name).read_text()
        assert OUTSIDE not in text and "submission_9" not in text, name
    compared = {r["first"] for r in ranked(out)} | {r["second"] for r in ranked(out)}
    assert compared == {"submission_1", "submission_2", HOSTILE_FOLDER}
    files = {r["file"] for r in ranked(out) if "submission_2" in (r["first"], r["second"])}
    assert files == {HOSTILE_FILE}  # its linked question1.py and llama/ were not read
