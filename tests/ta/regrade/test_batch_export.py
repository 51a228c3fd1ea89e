"""The batch as a TA runs it: the export found one folder down, a regrade on demand, and a
line per submission where the output is a log rather than a terminal."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from grader import cli
from grader.ta.regrade import batch, one
from grader.ta.regrade.census import census
from grader.ta.regrade.export import METADATA, ExportError, find_export
from tests.conftest import ROOT
from tests.ta.regrade.conftest import Regraded

# The shared regraded export lives on the "batch" worker.
pytestmark = pytest.mark.xdist_group("batch")


def _unzipped(regraded: Regraded, tmp_path: Path) -> Path:
    """The folder a TA unzipped the export into: Gradescope's zip holds one folder."""
    shutil.copytree(regraded.export, tmp_path / "unzipped" / "assignment_7_export")
    return tmp_path / "unzipped"


def test_find_export_takes_the_folder_named_or_the_one_below_it(tmp_path: Path) -> None:
    export = tmp_path / "unzipped" / "assignment_7_export"
    export.mkdir(parents=True)
    (export / METADATA).write_text("{}\n")
    (tmp_path / "unzipped" / "notes").mkdir()  # another folder without metadata: no matter
    assert find_export(export) == export
    assert find_export(tmp_path / "unzipped") == export
    with pytest.raises(ExportError, match="nor in a folder directly inside it"):
        find_export(tmp_path / "unzipped" / "notes")
    other = tmp_path / "unzipped" / "assignment_8_export"
    other.mkdir()
    (other / METADATA).write_text("{}\n")
    with pytest.raises(ExportError, match=r"several exports .*assignment_7_export"):
        find_export(tmp_path / "unzipped")


def test_an_export_named_as_its_zip_is_refused_with_how_to_unzip_it(tmp_path: Path) -> None:
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"assignment_7_export/{METADATA}", "{}\n")
    with pytest.raises(ExportError, match=r"is a zip: unzip it first \(unzip .*export\.zip -d"):
        find_export(archive)


def test_the_metadata_format_the_docs_show_is_the_one_read() -> None:
    """docs/reports.md's example of submission_metadata.yml is read as it says."""
    docs = (ROOT / "docs" / "reports.md").read_text()
    (example,) = re.findall(r"```yaml\n(.*?)```", docs, flags=re.S)
    (submitters,) = batch.parse_metadata(example).values()
    assert [(s.name, s.sid) for s in submitters] == [("Ada Lovelace", "1815")]


def test_the_folder_the_export_was_unzipped_into_is_regraded(
    regraded: Regraded,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = shutil.copytree(regraded.out, tmp_path / "out")
    monkeypatch.setattr(one.subprocess, "Popen", _no_process)
    log = io.StringIO()
    again = batch.main(
        export_dir=_unzipped(regraded, tmp_path), out_dir=out, parts=["part1"], line_file=log
    )
    assert again.counts["skipped"] == 20
    assert "the export is " in capsys.readouterr().err
    assert log.getvalue().startswith("20 of 20 already graded: kept (--regrade")


def _no_process(*args: object, **kwargs: object) -> None:
    raise AssertionError("a kept submission started a process")


def test_regrade_grades_again_and_a_log_gets_a_line_per_submission(
    regraded: Regraded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = shutil.copytree(regraded.out, tmp_path / "out")
    graded: list[str] = []

    def fake_grade(submission: Path, results: Path, **run: object) -> str:
        graded.append(submission.name)
        return "graded"  # the copied results file stands for the new grading

    monkeypatch.setattr(batch, "grade_one", fake_grade)
    log = io.StringIO()  # not a terminal, as stdout is under `make batch > log`
    again = batch.main(
        export_dir=regraded.export, out_dir=out, parts=["part1"], regrade=True, line_file=log
    )
    assert len(graded) == 20 and again.counts["graded"] == 20
    lines = log.getvalue().splitlines()
    assert len(lines) == 20
    assert re.fullmatch(
        r"\[1/20\] submission_\d+ .+: graded [\d.]+ / \d+.*\(\d+ s into the batch\)", lines[0]
    )
    assert lines[-1].startswith("[20/20] ")
    assert any("Student" in line or "," in line for line in lines)  # the students are named


def test_no_line_is_printed_on_a_terminal_or_when_quiet() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    row = batch.make_row("submission_1", [batch.Submitter("Ada", "1", "")], {"tests": []}, "graded")
    for file, enabled in ((Terminal(), True), (io.StringIO(), False)):
        log = batch.LineLog(1, 0, file, enabled=enabled)
        log.record(row)
        assert file.getvalue() == ""
    file = io.StringIO()
    batch.LineLog(1, 0, file).record(row)
    assert file.getvalue().startswith("[1/1] submission_1 Ada: graded 0 / 0 (")
    assert file.getvalue().rstrip().endswith(" s into the batch)")


def test_regrade_is_an_option_of_the_cli_and_of_make() -> None:
    args = cli.build_parser().parse_args(["batch", "x", "--out", "o", "--regrade"])
    assert args.regrade is True
    dry = subprocess.run(
        ["make", "-n", "batch", "EXPORT=x", "REGRADE=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--regrade" in dry.stdout
    dry = subprocess.run(
        ["make", "-n", "batch", "EXPORT=x"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "--regrade" not in dry.stdout


def test_the_mistake_census_is_in_both_summaries_as_in_the_report(regraded: Regraded) -> None:
    results = {
        p.parent.name: json.loads(p.read_text())
        for p in (regraded.out / "results").glob("*/results.json")
    }
    causes = census(results)
    assert len(causes) >= 10  # the export's planted mistakes, each named
    doc = json.loads((regraded.out / "summary.json").read_text())
    assert [(r["cause"], r["submissions"]) for r in doc["census"]] == [
        (c.cause, c.count) for c in causes
    ]
    assert doc["census"][0]["percent"] == round(100 * causes[0].count / 20, 1)
    assert set(doc["census"][0]["submission_ids"]) == set(causes[0].submissions)
    md = (regraded.out / "summary.md").read_text()
    assert "## Mistake census" in md
    for c in causes:
        row = rf"^\| `{re.escape(c.cause)}` \| {c.kind} \| {c.count} \| \d+ \| "
        assert re.search(row, md, re.M)
    html = (regraded.out / "report.html").read_text()
    assert all(c.cause in html for c in causes)
