"""The batch regrader: metadata parsing, aggregation, and a 20-submission export end to end."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from grader import cli
from grader.cli.submissions import cmd_batch
from grader.core.points import part_total
from grader.core.registry import PARTS
from grader.core.results import validate_results
from grader.sandbox.shared import Offer, SharedForkServer
from grader.ta.regrade import batch, one
from grader.ta.regrade.batch import (
    CheckRate,
    ExportError,
    Submitter,
    histogram,
    parse_metadata,
    part_scores,
    pass_rates,
)
from grader.ta.regrade.cluster import ClusterOptions
from tests.conftest import PRIVATE_VIEW, ROOT, SOLUTION
from tests.ta.regrade.conftest import Regraded
from tests.ta.regrade.export_factory import Entry, build_export, metadata_yaml, plan_export

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("batch")

NO_COUNTS = dict.fromkeys(batch.STATUSES, 0)

GRADESCOPE_YAML = """\
submission_123456789:
  :submitters:
  - :name: Ada Lovelace
    :sid: '1001'
    :email: ada@example.edu
  - :name: Charles Babbage
    :sid: 1002
    :email: cb@example.edu
  :created_at: 2026-10-01 12:00:00.000000000 -07:00
  :score: 12.0
  :status: processed
submission_2:
  submitters:
  - name: Grace Hopper
    sid: '1003'
    email: grace@example.edu
  score: !ruby/object:BigDecimal 18:0.12e2
"""


# ------------------------------------------------------------------ parse_metadata


def test_parse_metadata_reads_colon_and_plain_keys_and_every_submitter() -> None:
    meta = parse_metadata(GRADESCOPE_YAML)
    assert meta == {
        "submission_123456789": [
            Submitter("Ada Lovelace", "1001", "ada@example.edu"),
            Submitter("Charles Babbage", "1002", "cb@example.edu"),
        ],
        "submission_2": [Submitter("Grace Hopper", "1003", "grace@example.edu")],
    }


def test_parse_metadata_tolerates_missing_fields_and_empty_entries() -> None:
    meta = parse_metadata("submission_1:\n  :submitters:\n  - :name: Solo\nsubmission_2:\n")
    assert meta == {"submission_1": [Submitter("Solo", "", "")], "submission_2": []}
    assert parse_metadata("") == {}


def test_parse_metadata_matches_the_factorys_yaml() -> None:
    entries = plan_export(seed=3)
    meta = parse_metadata(metadata_yaml(entries))
    assert set(meta) == {e.folder for e in entries if e.in_metadata}
    for e in entries:
        if e.in_metadata:
            assert [p.name for p in meta[e.folder]] == [p["name"] for p in e.submitters]


@pytest.mark.parametrize(
    "text",
    ["submission_1: [unclosed", "- just\n- a list\n", "submission_1: 5\n", "s:\n  :submitters: 7"],
)
def test_parse_metadata_rejects_invalid_yaml_clearly(text: str) -> None:
    with pytest.raises(ExportError, match=r"submission_metadata\.yml"):
        parse_metadata(text)


def test_missing_or_invalid_metadata_exits_2(tmp_path: Path) -> None:
    (tmp_path / "submission_1").mkdir()
    args = cli.build_parser().parse_args(
        ["batch", str(tmp_path), "--out", str(tmp_path / "out"), "--parts", "part1", "--quiet"]
    )
    with pytest.raises(ExportError, match=r"cannot read submission_metadata\.yml"):
        batch.main(export_dir=tmp_path, out_dir=tmp_path / "out", progress=False)
    assert cmd_batch(args) == 2
    (tmp_path / "submission_metadata.yml").write_text("submission_1: [unclosed")
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "batch", str(tmp_path), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "submission_metadata.yml is not valid YAML" in proc.stderr
    assert not (tmp_path / "out" / "results").exists()  # nothing was graded


# ------------------------------------------------------------------ aggregation


def _test(number: str, score: float, max_score: float, part: str, passed: bool) -> dict:
    return {
        "name": f"{number} check",
        "number": number,
        "score": score,
        "max_score": max_score,
        "status": "passed" if passed else "failed",
        "tags": [part],
    }


def test_part_scores_sums_tagged_checks_and_marks_absent_parts() -> None:
    data = {
        "score": 5.5,
        "tests": [
            _test("1.1", 2, 2, "part1", True),
            _test("1.2", 0.5, 1, "part1", False),
            _test("2.1", 3, 4, "part2", False),
            {"name": "untagged", "score": 9, "max_score": 9},
        ],
    }
    others = {p: None for p in PARTS if p not in ("part1", "part2")}
    assert part_scores(data) == {"part1": 2.5, "part2": 3.0, **others}
    assert part_scores({"score": 0, "tests": []}) == dict.fromkeys(PARTS)


def test_pass_rates_counts_each_check_over_the_results_that_contain_it() -> None:
    a = {"tests": [_test("1.10", 1, 1, "part1", True), _test("1.2", 1, 1, "part1", True)]}
    b = {"tests": [_test("1.10", 0, 1, "part1", False), _test("1.2", 1, 1, "part1", True)]}
    c = {"tests": [_test("1.2", 0, 1, "part1", False)]}
    fallback = {"tests": [{"name": "Autograder error", "score": 0, "max_score": 20}]}
    assert pass_rates([a, b, c, fallback]) == [
        CheckRate("1.2", "check", 2, 3),  # natural order: 1.2 before 1.10; no number in names
        CheckRate("1.10", "check", 1, 2),
    ]
    assert pass_rates([]) == []


def test_histogram_bins_from_zero_to_the_maximum_inclusive() -> None:
    bins = histogram([0, 1.9, 2, 19.99, 20, 20], max_score=20, bins=10)
    assert [(lo, hi) for lo, hi, _ in bins][:2] == [(0, 2), (2, 4)]
    assert [c for *_, c in bins] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 3]
    assert sum(c for *_, c in histogram([], max_score=0)) == 0


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_rate_and_eta_on_a_terminal_only() -> None:
    tty = _Terminal()
    bar = batch.progress_bar(20, initial=5, file=tty)
    bar.set_postfix_str("graded submission_123 (12/50)", refresh=False)
    bar.update()
    bar.close()
    last = tty.getvalue().split("\r")[-1]
    assert "6/20" in last and "sub/s" in last and "<" in last  # count, rate, elapsed<ETA
    assert "graded submission_123 (12/50)" in last
    quiet = io.StringIO()  # not a terminal: nothing at all
    bar = batch.progress_bar(20, file=quiet)
    bar.update()
    bar.close()
    assert quiet.getvalue() == ""
    off = _Terminal()  # --quiet on a terminal
    bar = batch.progress_bar(20, enabled=False, file=off)
    bar.update()
    bar.close()
    assert off.getvalue() == ""


# ------------------------------------------------------------------ end to end


def _csv(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "scores.csv", newline="") as f:
        return {row["submission_id"]: row for row in csv.DictReader(f)}


def test_every_submission_has_a_valid_results_file(regraded: Regraded) -> None:
    for e in regraded.entries:
        path = regraded.out / "results" / e.folder / "results.json"
        validate_results(json.loads(path.read_text()))


def test_every_grading_forks_its_workers_from_the_batchs_shared_server(
    regraded: Regraded,
) -> None:
    """The batch imports the libraries once: every grading that started a worker adopted
    a server forked for it from the batch's, and none imported them itself."""
    starts = []
    for e in regraded.entries:
        data = json.loads((regraded.out / "results" / e.folder / "results.json").read_text())
        if data.get("extra_data", {}).get("worker_starts"):
            starts.append(data["extra_data"]["worker_starts"])
    assert len(starts) >= len(regraded.entries) - 2  # all but the hang and the crash
    assert all(list(s) == ["shared fork server"] for s in starts)


def _record_shared_servers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The batch's shared fork servers and the per-grading servers they offered, as the
    batch makes them (other tests' servers, running beside this one, are not counted)."""
    made: list[Any] = []
    real_server, real_offer = batch.shared_server, SharedForkServer.offer

    def shared_server(**kwargs):
        made.append(real_server(**kwargs))
        return made[-1]

    def offer(self, *args, **kwargs):
        made.append(real_offer(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(batch, "shared_server", shared_server)
    monkeypatch.setattr(SharedForkServer, "offer", offer)
    return made


def _left_running(made: list[Any]) -> list[Any]:
    """Those of ``made`` still running: a shared server not closed, a grading's server."""
    return [
        m for m in made
        if (isinstance(m, Offer) and m.alive())
        or (isinstance(m, SharedForkServer) and m.server is not None)
    ]  # fmt: skip


def test_scores_csv_has_the_expected_part1_totals(regraded: Regraded) -> None:
    rows = _csv(regraded.out)
    assert list(rows) == sorted(rows, key=batch.natural_key)
    assert list(rows) == [r.submission_id for r in regraded.summary.rows]
    assert set(rows) == {e.folder for e in regraded.entries}
    assert list(next(iter(rows.values()))) == [
        "submission_id", "names", "emails", "sids", *PARTS, "score", "bonus", "total", "max_score",
        "status",
    ]  # fmt: skip
    for e in regraded.entries:
        row = rows[e.folder]
        assert row["status"] == "graded", e
        assert row["max_score"] == "20" and row["bonus"] == "0"  # Part 1 has no bonus
        assert all(row[p] == "" for p in PARTS if p != "part1")  # not graded in this batch
        assert row["total"] == row["part1"]
        score = float(row["part1"])
        if e.kind == "solution":
            assert score == 20, e
        elif e.kind.startswith("hang"):
            assert score == 19, e  # only 1.10 (1 point) calls the hanging function
        else:
            assert score < 20, e
            if e.kind in ("blank", "crash"):
                assert score == 0, e
    assert regraded.summary.counts == {**NO_COUNTS, "graded": 20}


def test_submitters_are_joined_and_missing_metadata_leaves_names_empty(
    regraded: Regraded,
) -> None:
    rows = _csv(regraded.out)
    two, absent, plain = (rows[regraded.entries[i].folder] for i in (1, 2, 3))
    assert two["names"] == "Student 1; Partner B"
    assert two["sids"] == "1001; 2001"
    assert two["emails"] == "s1@example.edu; b@example.edu"
    assert absent["names"] == absent["sids"] == absent["emails"] == ""
    assert plain["names"] == "Student 3"


def test_summary_files_agree_with_the_results(regraded: Regraded) -> None:
    out = regraded.out
    doc = json.loads((out / "summary.json").read_text())
    totals = [float(r["total"]) for r in _csv(out).values()]
    assert doc["submissions"] == 20 and doc["counts"]["graded"] == 20
    assert doc["total"]["max"] == 20 and doc["total"]["min"] == 0
    assert doc["total"]["mean"] == pytest.approx(sum(totals) / 20, abs=1e-4)
    assert sum(b["count"] for b in doc["histogram"]) == 20
    rates = {r["number"]: r for r in doc["pass_rates"]}
    assert len(rates) == 13 and all(r["total"] == 20 for r in rates.values())
    assert rates["1.10"]["passed"] <= 20 - 2 - 1 - 1  # blanks, crash and hang fail it
    md = (out / "summary.md").read_text()
    assert "![score histogram](score_histogram.png)" in md
    assert f"| 1.10 | {rates['1.10']['name']} | {rates['1.10']['passed']}/20 |" in md
    assert (out / "score_histogram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _checks(out: Path, folder: str) -> dict[str, tuple[float, str]]:
    data = json.loads((out / "results" / folder / "results.json").read_text())
    return {t.get("number", t["name"]): (t["score"], t["status"]) for t in data["tests"]}


def test_the_slurm_code_path_through_submitit_local_gives_the_same_scores(
    regraded: Regraded, tmp_path: Path
) -> None:
    """Part of the same export, one submitit array task per submission (2 at a time)
    instead of threads: every row and every check's score and verdict as the local
    executor's. The part holds a submission of each kind (the solutions with their
    metadata quirks, a blank, two mutants, the hang and the crash)."""
    most = {"solution": 4, "blank": 1, "mutant": 2, "hang": 1, "crash": 1}  # of each kind
    picked = []
    for kind, count in most.items():
        picked += [e for e in regraded.entries if e.kind.split(":")[0] == kind][:count]
    export = build_export(tmp_path / "export", picked)
    out = tmp_path / "cluster"
    options = ClusterOptions(executor="submitit-local", array_parallelism=2)
    started = time.monotonic()
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], timeout_s=120,
        progress=False, cluster=options,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    n = len(picked)
    print(f"\nsubmitit-local batch of {n}: {elapsed:.1f} s, {60 * n / elapsed:.1f}/min")
    row = lambda r: (r.submission_id, r.submitters, r.status, r.parts, r.total, r.max_score)  # noqa: E731
    folders = {e.folder for e in picked}
    local = [r for r in regraded.summary.rows if r.submission_id in folders]
    assert len(local) == n and [row(r) for r in summary.rows] == [row(r) for r in local]
    results = [json.loads((regraded.out / "results" / f / "results.json").read_text())
               for f in sorted(folders)]  # fmt: skip
    assert summary.rates == pass_rates(results)
    for e in picked:
        assert _checks(out, e.folder) == _checks(regraded.out, e.folder), e
        task = json.loads((out / "results" / e.folder / "task.json").read_text())
        assert (task["executor"], task["state"], task["status"]) == (
            "submitit-local",
            "done",
            "graded",
        )
        assert Path(task["stdout"]).exists()  # each task's log is kept
    local_csv = (regraded.out / "scores.csv").read_text().splitlines()
    kept = [local_csv[0], *(line for line in local_csv[1:] if line.split(",")[0] in folders)]
    assert (out / "scores.csv").read_text().splitlines() == kept


def test_a_second_run_skips_everything_without_starting_a_process(
    regraded: Regraded,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    out = shutil.copytree(regraded.out, tmp_path / "out")

    def no_popen(*args, **kwargs):
        raise AssertionError("a skipped submission started a process")

    monkeypatch.setattr(one.subprocess, "Popen", no_popen)
    tty = _Terminal()
    again = batch.main(
        export_dir=regraded.export, out_dir=out, parts=["part1"], progress=True, progress_file=tty
    )
    assert again.counts == {**NO_COUNTS, "skipped": 20}
    assert [(r.submission_id, r.total) for r in again.rows] == [
        (r.submission_id, r.total) for r in regraded.summary.rows
    ]
    # The class's record is the earlier run's, not "skipped": each row keeps how its
    # grading ended, and the summary says what this run added.
    first = {k: r["status"] for k, r in _csv(regraded.out).items()}
    assert {k: r["status"] for k, r in _csv(out).items()} == first
    assert "skipped" not in first.values()
    summary = (out / "summary.md").read_text()
    assert "20 kept from an earlier run (" in summary
    assert "this run: nothing more to grade" in summary
    assert not re.search(r"\b0 graded", summary)
    assert "(kept)" in (out / "report.html").read_text()
    assert "20/20" in tty.getvalue().split("\r")[-1]  # every skipped one counted as done
    # stderr is not a terminal under pytest: no progress bar, only the export's own warning
    # (one folder is deliberately missing from the metadata).
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "has a folder but no entry in submission_metadata.yml" in err[0]


# ------------------------------------------------------------------ failures of the grader


def _one_submission(tmp_path: Path) -> tuple[Path, Path]:
    export = tmp_path / "export"
    shutil.copytree(SOLUTION, export / "submission_1", ignore=shutil.ignore_patterns("*.png"))
    (export / "submission_metadata.yml").write_text(
        "submission_1:\n  :submitters:\n  - :name: Ada\n    :sid: '1'\n"
    )
    return export, tmp_path / "out"


def test_a_grader_killed_by_the_batch_timeout_gets_a_fallback(tmp_path: Path) -> None:
    export, out = _one_submission(tmp_path)
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], timeout_s=0.5, progress=False
    )
    assert [r.status for r in summary.rows] == ["timeout"]
    data = json.loads((out / "results" / "submission_1" / "results.json").read_text())
    validate_results(data)
    assert data["score"] == 0 and "timed out after 0.5 s" in data["output"]
    assert data["tests"][0]["max_score"] == 20
    row = _csv(out)["submission_1"]
    assert (row["status"], row["total"], row["max_score"]) == ("timeout", "0", "20")
    assert row["names"] == "Ada"


def _record_batch_tmp(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders the batch creates for its graders' sandboxes, as it creates them."""
    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs) -> str:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(one.tempfile, "mkdtemp", mkdtemp)
    return made


def _processes_in(folders: list[str]) -> list[int]:
    """Processes running from (cwd) or naming (argv) one of ``folders``."""
    found = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        text = " ".join([proc.info["cwd"] or "", *(proc.info["cmdline"] or [])])
        if any(folder in text for folder in folders):
            found.append(proc.pid)
    return found


def test_the_batch_timeout_kills_the_grader_and_its_busy_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After 6 s the grader waits on its worker, stuck in answer_table for up to 20 s; the
    worker leads a session of its own, so killing the grader's group alone would leave it."""
    export = build_export(tmp_path / "export", [Entry("submission_7", "hang")])
    made = _record_batch_tmp(monkeypatch)
    servers = _record_shared_servers(monkeypatch)
    summary = batch.main(
        export_dir=export, out_dir=tmp_path / "out", parts=["part1"], timeout_s=6, progress=False
    )
    assert summary.counts["timeout"] == 1 and len(made) == 1
    assert not Path(made[0]).exists()  # the grader's sandbox went with it
    assert _processes_in(made) == []
    assert len(servers) == 2 and _left_running(servers) == []  # the batch's, the grader's


def test_an_interrupted_batch_kills_its_graders_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = [Entry("submission_1", "solution"), Entry("submission_2", "hang:sleep")]
    export, out = build_export(tmp_path / "export", entries), tmp_path / "out"
    made = _record_batch_tmp(monkeypatch)
    real_make_row = batch.make_row

    def ctrl_c(*args, **kwargs):  # the first finished grading is when the TA presses Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(batch, "make_row", ctrl_c)
    servers = _record_shared_servers(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        batch.main(export_dir=export, out_dir=out, jobs=2, parts=["part1"], progress=False)
    assert _processes_in(made) == []
    assert len(servers) == 3 and _left_running(servers) == []
    assert batch.load_valid(out / "results" / "submission_1" / "results.json")
    assert not (out / "results" / "submission_2" / "results.json").exists()
    monkeypatch.setattr(batch, "make_row", real_make_row)
    again = batch.main(export_dir=export, out_dir=out, parts=["part1"], timeout_s=3, progress=False)
    assert [r.status for r in again.rows] == ["skipped", "timeout"]


def test_a_grader_that_writes_no_results_is_an_error_with_a_fallback(tmp_path: Path) -> None:
    export, out = _one_submission(tmp_path)
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], python="/bin/false", progress=False
    )
    assert summary.counts["error"] == 1
    data = json.loads((out / "results" / "submission_1" / "results.json").read_text())
    validate_results(data)
    assert "exited (1) without a valid results file" in data["output"]
    # An error is still a valid file, so the next run keeps it.
    assert batch.main(export_dir=export, out_dir=out, progress=False).counts["skipped"] == 1


def test_cells_that_look_like_formulas_are_written_as_text(tmp_path: Path) -> None:
    from grader.ta.regrade.outputs import safe_cell

    assert safe_cell('=HYPERLINK("http://x")') == '\'=HYPERLINK("http://x")'
    assert safe_cell("+1") == "'+1" and safe_cell("@SUM(A1)") == "'@SUM(A1)"
    assert safe_cell("Ada Lovelace") == "Ada Lovelace"
    student = {"name": "=cmd|' /C calc'!A0", "sid": "-5", "email": "e@example.edu"}
    export = build_export(tmp_path / "export", [Entry("submission_1", "blank", [student])])
    batch.main(export_dir=export, out_dir=tmp_path / "out", parts=["part1"], progress=False)
    with open(tmp_path / "out" / "scores.csv", newline="") as f:
        row = next(iter(csv.DictReader(f)))
    assert row["names"] == "'=cmd|' /C calc'!A0" and row["sids"] == "'-5"


@pytest.mark.needs_root(reason="the sweep by worker account needs a root grader")
def test_a_batch_timeout_sweeps_a_daemon_that_left_the_sandbox(tmp_path: Path) -> None:
    """The daemon changed its folder and session; only its account and run gid betray it."""
    export = build_export(tmp_path / "export", [Entry("submission_9", "solution")])
    target = export / "submission_9" / "question1.py"
    text = target.read_text()
    anchor = "    d, kv_dim = spec.d_model"
    daemon = (
        "    import subprocess, time\n"
        "    DOUBLE_FORK = ('import os, time; os.fork() and os._exit(0); '\n"
        "                   'os.setsid(); time.sleep(301.5)')\n"
        "    subprocess.Popen(['python3', '-c', DOUBLE_FORK],\n"
        "                     cwd='/', start_new_session=True)\n"
        "    time.sleep(120)\n"
    )
    target.write_text(text.replace(anchor, daemon + anchor, 1))
    summary = batch.main(
        export_dir=export, out_dir=tmp_path / "out", parts=["part1"], timeout_s=10, progress=False
    )
    assert summary.counts["timeout"] == 1
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if "time.sleep(301.5)" in " ".join(p.info["cmdline"] or [])
    ]
    assert left == []


@PRIVATE_VIEW
def test_a_submission_cannot_see_the_rest_of_the_export(tmp_path: Path) -> None:
    """Other students' folders and the export's names and emails are covered (the export
    lies outside /tmp here, which the worker's private view replaces anyway)."""
    outside = Path(tempfile.mkdtemp(prefix="kvexport-", dir="/"))
    outside.chmod(0o755)  # readable by everyone, as a TA's download folder often is
    try:
        _grade_peeking_submission(outside / "export", tmp_path)
    finally:
        shutil.rmtree(outside)


def _grade_peeking_submission(export_dir: Path, tmp_path: Path) -> None:
    export = build_export(export_dir, [Entry("submission_3", "solution")])
    target = export / "submission_3" / "question1.py"
    anchor = "    d, kv_dim = spec.d_model"
    seen = f"os.path.exists({str(export)!r}) and os.listdir({str(export)!r})"
    peek = f"    import os\n    assert not ({seen}), 'the export is visible'\n"
    target.write_text(target.read_text().replace(anchor, peek + anchor, 1))
    batch.main(export_dir=export, out_dir=tmp_path / "out", parts=["part1"], progress=False)
    data = json.loads((tmp_path / "out" / "results" / "submission_3" / "results.json").read_text())
    first = next(t for t in data["tests"] if t["number"] == "1.1")
    assert first["score"] == first["max_score"], first.get("output")


def test_the_default_regrade_folder_is_never_committed() -> None:
    """``make batch``'s default output holds names, emails and SIDs: git must ignore it."""
    out = re.search(r"^OUT\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    for rel in ("scores.csv", "results/submission_1/results.json"):
        proc = subprocess.run(
            ["git", "check-ignore", "-q", f"{out}/{rel}"], cwd=ROOT, capture_output=True
        )
        assert proc.returncode == 0, f"{out}/{rel} is not ignored"


def test_a_row_counts_its_bonus_apart() -> None:
    data = {
        "score": 24,
        "tests": [
            {"name": "4.1", "number": "4.1", "score": 20, "max_score": 20, "tags": ["part4"]},
            {"name": "4.7", "number": "4.7", "score": 4, "max_score": 0, "tags": ["part4"]},
        ],
    }
    row = batch.make_row("submission_1", [], data, "graded")
    assert (row.total, row.bonus, row.max_score) == (24, 4, 20)
    assert row.parts["part4"] == 20 and row.score.text() == "20 / 20 + 4 bonus"


def test_folders_and_metadata_that_disagree_are_warned_both_ways(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "export"
    (export / "submission_1").mkdir(parents=True)
    (export / "submission_3").mkdir()
    (export / batch.METADATA).write_text(
        "submission_1:\n  :submitters:\n  - :name: Ada\nsubmission_2:\n  :submitters: []\n"
    )
    _, folders = batch.read_export(export, tmp_path / "out")
    err = capsys.readouterr().err
    assert folders == ["submission_1", "submission_3"]
    assert "submission_2 is in submission_metadata.yml but has no folder" in err
    assert "submission_3 has a folder but no entry in submission_metadata.yml" in err


def _export_with_a_linked_folder(tmp_path: Path) -> tuple[Path, Path]:
    """An export whose ``submission_2`` is a link to a folder outside it (another
    course's work, a TA's home), named in the metadata like any submission."""
    export, out = _one_submission(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(export / "submission_1", elsewhere)
    (export / "submission_2").symlink_to(elsewhere, target_is_directory=True)
    (export / batch.METADATA).write_text(
        "submission_1:\n  :submitters: []\nsubmission_2:\n  :submitters: []\n"
    )
    return export, out


def test_an_export_folder_that_is_a_link_is_skipped_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export, out = _export_with_a_linked_folder(tmp_path)
    _, folders = batch.read_export(export, out)
    err = capsys.readouterr().err
    assert folders == ["submission_1"]
    assert "submission_2 is skipped: it is a link" in err and str(tmp_path / "elsewhere") in err
    assert "has no folder" not in err  # refused, not missing


def test_an_export_folder_that_is_a_link_is_never_graded(tmp_path: Path) -> None:
    export, out = _export_with_a_linked_folder(tmp_path)
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\nexit 1\n")
    failing.chmod(0o755)
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], python=str(failing), device="cpu",
        progress=False,
    )  # fmt: skip
    assert [r.submission_id for r in summary.rows] == ["submission_1"]
    assert sorted(p.name for p in (out / "results").iterdir()) == ["submission_1"]
    assert "submission_2" not in (out / "scores.csv").read_text()


def test_the_histogram_counts_whole_submissions_and_marks_full_marks_and_bonus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from matplotlib.figure import Figure

    from grader.ta.regrade.outputs import save_histogram

    saved: list[Figure] = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    bins = batch.histogram([3, 10, 20, 24], max_score=20)
    save_histogram(bins, tmp_path / "h.png", max_score=20)
    [ax] = saved[0].axes
    assert all(float(t).is_integer() for t in ax.get_yticks())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["full marks (20)", "bonus"]
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [20]


def test_a_grader_killed_by_the_infrastructure_is_graded_again(tmp_path: Path) -> None:
    """A cancelled or preempted task, a lost node, the OOM killer: the grader dies by a
    signal that is not the batch's timeout. That is no result of the student's: the file
    says so, names the device and profile, and the next run grades it again."""
    export, out = _one_submission(tmp_path)
    killed = tmp_path / "killed-python"
    killed.write_text("#!/bin/sh\nkill -TERM $$\n")
    killed.chmod(0o755)
    summary = batch.main(
        export_dir=export, out_dir=out, parts=["part1"], python=str(killed), device="cpu",
        progress=False,
    )  # fmt: skip
    assert summary.counts["interrupted"] == 1
    data = json.loads((out / "results" / "submission_1" / "results.json").read_text())
    validate_results(data)
    assert "killed by SIGTERM" in data["output"] and "not by this submission" in data["output"]
    assert data["extra_data"] == {"device": "cpu", "benchmark_profile": "cpu", "interrupted": True}
    again = batch.main(export_dir=export, out_dir=out, parts=["part1"], progress=False)
    assert again.counts["graded"] == 1 and again.counts["skipped"] == 0


def test_a_class_regrade_grades_the_edited_files_uploaded_alone(tmp_path: Path) -> None:
    """An export whose submission holds only the two Part 3 files the student edited, one
    in its ``llama/`` folder, one flat: the batch supplies the given files and grades it at
    full marks (the same grading as ``grade``; tests/grading/test_upload_shapes.py grades
    each shape on its own)."""
    export = tmp_path / "export"
    part3 = PARTS["part3"]
    in_folder, flat = part3.edited  # llama/model.py, llama/generation.py
    uploaded = {in_folder: in_folder, Path(flat).name: flat}  # where uploaded: the file
    for where, rel in uploaded.items():
        target = export / "submission_1" / where
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOLUTION / rel, target)
    (export / "submission_metadata.yml").write_text(
        metadata_yaml([Entry("submission_1", "solution")])
    )
    out = tmp_path / "out"
    batch.main(export_dir=export, out_dir=out, jobs=2, parts=["part3"], progress=False)
    row = _csv(out)["submission_1"]
    assert float(row["part3"]) == part_total("part3"), row
    results = json.loads((out / "results" / "submission_1" / "results.json").read_text())
    assert sorted(results["extra_data"]["files"]["part3"]["supplied"]) == sorted(part3.given)


def test_the_class_server_imports_what_every_grading_would_import_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A class regrade's shared server imports each part's libraries and, once for the
    whole class, what the part's workers would import in every grading (Part 1's plots),
    in the order the parts come."""
    asked: list[tuple[str, ...]] = []

    def start_shared(preload: tuple[str, ...], env: dict, python: str) -> tuple[None, str]:
        asked.append(preload)
        return None, "not started in this test"

    monkeypatch.setattr(batch, "start_shared", start_shared)
    assert batch.shared_server(device="cpu", parts=["part1", "part2"]) is None
    assert asked == [("numpy", "matplotlib.pyplot", "torch")]
    assert PARTS["part1"].class_preload == ("matplotlib.pyplot",)
