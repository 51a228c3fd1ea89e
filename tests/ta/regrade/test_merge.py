"""``merge``: CPU scores (a batch output or Gradescope's CSV) with a GPU run's checks."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from grader import cli
from grader.core.results import fallback_results, validate_results
from grader.ta.regrade.merge import MergeError, main

PEOPLE = {
    "submission_1": [
        {"name": "Ada Lovelace", "sid": "1001", "email": "ada@example.edu"},
        {"name": "Charles Babbage", "sid": "1002", "email": "cb@example.edu"},
    ],
    "submission_2": [{"name": "Grace Hopper", "sid": "1003", "email": "grace@example.edu"}],
    "submission_3": [{"name": "Alan Turing", "sid": "1004", "email": "alan@example.edu"}],
}


def _check(number: str, score: float, max_score: float) -> dict:
    status = "passed" if score >= max_score else "failed"
    part = f"part{number.split('.')[0]}"
    return {"name": f"{number} check", "number": number, "score": score,
            "max_score": max_score, "status": status, "tags": [part]}  # fmt: skip


def _results(device: str, *checks: dict) -> dict:
    data = {
        "score": sum(c["score"] for c in checks),
        "output": f"graded on {device}",
        "tests": list(checks),
        "extra_data": {"device": device, "benchmark_profile": device,
                       "benchmark_profile_provisional": False},
    }  # fmt: skip
    validate_results(data)
    return data


def _batch_output(root: Path, results: dict[str, dict]) -> Path:
    for folder, data in results.items():
        path = root / "results" / folder / "results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(data))
    (root / "submitters.json").write_text(json.dumps({f: PEOPLE[f] for f in results}))
    return root


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    """A CPU batch (1.1, 2.11, 3.11 on cpu) and a GPU batch (2.11, 3.11 on cuda; one task
    that died; one submission only the GPU run has)."""
    cpu = _batch_output(
        tmp_path / "cpu",
        {
            "submission_1": _results("cpu", _check("1.1", 2, 2), _check("2.11", 0, 3),
                                     _check("3.11", 4, 4)),
            "submission_2": _results("cpu", _check("1.1", 1, 2), _check("2.11", 3, 3),
                                     _check("3.11", 4, 4)),
        },
    )  # fmt: skip
    died = fallback_results("Cluster task 4242_1 did not finish", 7.0)
    gpu = _batch_output(
        tmp_path / "gpu",
        {
            "submission_1": _results("cuda", _check("2.11", 3, 3), _check("3.11", 0, 4)),
            "submission_2": died,
            "submission_3": _results("cuda", _check("2.11", 3, 3), _check("3.11", 4, 4)),
        },
    )
    return cpu, gpu


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "scores.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_gpu_checks_replace_the_cpu_ones_and_say_where_they_ran(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    cpu, gpu = runs
    summary = main(cpu=cpu, gpu=gpu, out_dir=tmp_path / "merged")
    assert summary.counts == {"merged": 1, "gpu-missing": 1, "cpu-missing": 1}
    data = json.loads((tmp_path / "merged/results/submission_1/results.json").read_text())
    validate_results(data)
    by_number = {t["number"]: t for t in data["tests"]}
    assert [t["number"] for t in data["tests"]] == ["1.1", "2.11", "3.11"]
    assert (by_number["2.11"]["score"], by_number["3.11"]["score"]) == (3, 0)  # the GPU's
    assert data["score"] == 5  # 2 (CPU's 1.1) + 3 + 0 (GPU's 2.11, 3.11)
    graded_by = {n: t["extra_data"]["graded_by"] for n, t in by_number.items()}
    assert {n: (g["run"], g["device"], g["profile"]) for n, g in graded_by.items()} == {
        "1.1": ("cpu", "cpu", "cpu"),
        "2.11": ("gpu", "cuda", "cuda"),
        "3.11": ("gpu", "cuda", "cuda"),
    }
    assert str(gpu) in graded_by["2.11"]["source"]
    assert data["extra_data"]["merge"]["checks_from_gpu"] == ["2.11", "3.11"]
    assert "graded on cuda with the cuda profile" in data["output"]
    page = (tmp_path / "merged" / "report.html").read_text()  # the merged class, one page
    for folder in ("submission_1", "submission_2", "submission_3"):
        assert f'<a href="#sub-{folder}">{folder}</a>' in page and f'id="sub-{folder}"' in page


def test_scores_csv_has_one_row_per_student_and_flags_missing_runs(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    cpu, gpu = runs
    main(cpu=cpu, gpu=gpu, out_dir=tmp_path / "merged")
    rows = _rows(tmp_path / "merged")
    assert list(rows[0])[:6] == ["Name", "SID", "Email", "Total Score", "Max Points",
                                 "Submission ID"]  # fmt: skip
    table = {r["SID"]: r for r in rows}
    assert [r["Name"] for r in rows] == ["Ada Lovelace", "Charles Babbage", "Grace Hopper",
                                         "Alan Turing"]  # fmt: skip
    assert table["1001"]["Total Score"] == table["1002"]["Total Score"] == "5"
    assert table["1001"]["Max Points"] == "9" and table["1001"]["part2"] == "3"
    assert (table["1001"]["GPU checks"], table["1001"]["GPU device"]) == ("2.11 3.11", "cuda")
    # The GPU task died: every CPU check is kept, and the row says so.
    assert (table["1003"]["merge status"], table["1003"]["Total Score"]) == ("gpu-missing", "8")
    assert table["1003"]["GPU checks"] == ""
    assert (table["1004"]["merge status"], table["1004"]["Total Score"]) == ("cpu-missing", "7")
    doc = json.loads((tmp_path / "merged" / "merge.json").read_text())
    assert doc["submissions"]["submission_2"]["status"] == "gpu-missing"


def _gradescope_csv(path: Path, max_points: float) -> Path:
    header = ["First Name", "Last Name", "SID", "Email", "Total Score", "Max Points",
              "Status", "Submission ID", "Submission Time"]  # fmt: skip
    rows = [
        ["Ada", "Lovelace", "1001", "ada@example.edu", "80", max_points, "Graded", "1", ""],
        ["Charles", "Babbage", "1002", "cb@example.edu", "80", max_points, "Graded", "1", ""],
        ["Alan", "Turing", "1004", "alan@example.edu", "", max_points, "Missing", "", ""],
    ]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def test_gradescope_totals_get_the_gpu_checks_added(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    _, gpu = runs
    scores = _gradescope_csv(tmp_path / "scores.csv", 93)  # 93 + the GPU's 7 = 100
    main(cpu=scores, gpu=gpu, out_dir=tmp_path / "merged")
    table = {r["SID"]: r for r in _rows(tmp_path / "merged")}
    assert table["1001"]["Name"] == "Ada Lovelace"
    assert (table["1001"]["Total Score"], table["1001"]["Max Points"]) == ("83", "100")
    assert table["1001"]["CPU profile"] == "cpu" and table["1001"]["merge status"] == "merged"
    data = json.loads((tmp_path / "merged/results/submission_1/results.json").read_text())
    assert data["tests"][0]["name"] == "Gradescope autograder (CPU checks)"


def test_gradescope_totals_that_already_count_the_gpu_checks_are_refused(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, gpu = runs
    scores = _gradescope_csv(tmp_path / "scores.csv", 100)
    with pytest.raises(MergeError, match="already counts the GPU checks"):
        main(cpu=scores, gpu=gpu, out_dir=tmp_path / "merged")
    argv = ["merge", "--cpu", str(scores), "--gpu", str(gpu), "--out", str(tmp_path / "m")]
    assert cli.main(argv) == 2
    assert "kvgrader batch EXPORT --out cpu" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    argv = ["merge", "--cpu", str(tmp_path), "--gpu", str(gpu), "--out", str(tmp_path / "m")]
    assert cli.main(argv) == 2  # not a batch output
    assert "is not a batch output" in capsys.readouterr().err


def test_cells_a_student_controls_are_written_as_text(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    # A name that a spreadsheet would run as a formula (CSV injection) is escaped, as in
    # batch's scores.csv.
    cpu, gpu = runs
    for side in (cpu, gpu):
        people = side / "submitters.json"
        people.write_text(people.read_text().replace("Grace Hopper", '=HYPERLINK(\\"x\\")'))
    main(cpu=cpu, gpu=gpu, out_dir=tmp_path / "merged")
    names = [r["Name"] for r in _rows(tmp_path / "merged")]
    assert names[2].startswith("'=HYPERLINK(")
    assert not [n for n in names if n.startswith(("=", "+", "-", "@"))]


def test_a_cpu_only_batch_becomes_the_upload_sheet(runs: tuple[Path, Path], tmp_path: Path) -> None:
    cpu, _ = runs
    summary = main(cpu=cpu, gpu=None, out_dir=tmp_path / "sheet")
    rows = _rows(tmp_path / "sheet")
    assert list(rows[0])[:5] == ["Name", "SID", "Email", "Total Score", "Max Points"]
    assert {r["merge status"] for r in rows} == {"cpu-only"}
    assert {r["SID"]: r["Total Score"] for r in rows}["1003"] == "8"
    assert summary.counts == {"cpu-only": 2}  # two submissions, three students


@pytest.mark.parametrize("flag", [True, None], ids=["provisional", "predates-the-flag"])
def test_gpu_results_of_a_provisional_profile_are_refused(
    runs: tuple[Path, Path], tmp_path: Path, flag: bool | None
) -> None:
    cpu, gpu = runs
    path = gpu / "results" / "submission_3" / "results.json"
    data = json.loads(path.read_text())
    if flag is None:
        del data["extra_data"]["benchmark_profile_provisional"]
    else:
        data["extra_data"]["benchmark_profile_provisional"] = flag
    path.write_text(json.dumps(data))
    with pytest.raises(MergeError, match=r"1 GPU result\(s\) \(submission_3\).*provisional"):
        main(cpu=cpu, gpu=gpu, out_dir=tmp_path / "merged")
    assert not (tmp_path / "merged").exists()
