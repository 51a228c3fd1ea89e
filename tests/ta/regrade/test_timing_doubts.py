"""Timed checks decided late or never are named in the class report and in the student's
feedback, so that a TA can time them again on a quiet machine."""

from __future__ import annotations

from grader.core.feedback import decision_words
from grader.ta.regrade.census import timing_doubts
from grader.ta.regrade.class_page import doubts_table

UNDECIDED = {"label": "vs reference", "decision": "undecided", "passed": True}
OWN_NOISE = {"label": "speedup", "decision": "own noise", "passed": False}


def results(record: dict) -> dict:
    return {"extra_data": {"benchmarks": {"3.11": record}}, "tests": []}


def test_the_class_page_lists_every_undecided_or_late_check() -> None:
    found = timing_doubts({
        "sub_10": results({"passed": True, "undecided": ["vs reference"], "decided_late": []}),
        "sub_2": results({"passed": True, "undecided": [], "decided_late": ["speedup"]}),
        "sub_3": results({"passed": True, "undecided": [], "decided_late": []}),
    })  # fmt: skip
    assert [(d["submission"], d["check"]) for d in found] == [("sub_2", "3.11"), ("sub_10", "3.11")]
    html = doubts_table(found)
    assert "sub_10" in html and "vs reference" in html and "quiet machine" in html
    assert "decided within" in doubts_table([])


def test_the_feedback_says_who_made_the_noise_in_plain_words() -> None:
    words = decision_words({"criteria": [UNDECIDED, OWN_NOISE], "decided_late": ["batch 1"]})
    assert any("counts as met" in w and "vs reference" in w for w in words)
    assert any("far noisier" in w and "speedup" in w for w in words)
    assert any("extra rounds: batch 1" in w for w in words)
    assert decision_words({"criteria": [{"label": "x", "decision": "passed"}]}) == []


def test_the_summary_files_list_the_checks_to_time_again(tmp_path) -> None:
    """summary.md and summary.json carry the same list as the class report, and say nothing
    of it when every timed check was decided in its ordinary rounds."""
    import json

    from grader.ta.regrade.outputs import BatchSummary, Row, write_outputs

    doubts = timing_doubts(
        {"sub_7": results({"passed": True, "undecided": ["vs reference"], "decided_late": []})}
    )
    from grader.core.registry import PARTS

    row = Row("sub_7", [], "graded", {**dict.fromkeys(PARTS), "part3": 30.0}, 30.0, 30.0)
    stats = {"mean": 30.0, "median": 30.0, "min": 30.0, "max": 30.0}
    write_outputs(BatchSummary(tmp_path, [row], {"graded": 1}, stats, [], 1.0, doubts=doubts))
    md = (tmp_path / "summary.md").read_text()
    assert "## Timed checks to time again" in md
    assert "| sub_7 | 3.11 | passed | vs reference |  |" in md
    assert json.loads((tmp_path / "summary.json").read_text())["timing_doubts"] == doubts
    write_outputs(BatchSummary(tmp_path, [row], {"graded": 1}, stats, [], 1.0))
    assert "time again" not in (tmp_path / "summary.md").read_text()
