"""A check whose request timed out on a busy machine is listed for the TA beside the timed
checks decided late or never: it is to be graded again on a quiet machine."""

from __future__ import annotations

from grader.runtime.starvation import STARVED
from grader.ta.regrade.census import timing_doubts
from grader.ta.regrade.class_page import doubts_table
from grader.ta.regrade.outputs import doubts_markdown

EVENT = {"request": "generate(prompt 3)", "wall_s": 20.0, "cpu_s": 0.3, "waiting_s": 19.5}


def results(*tests: dict) -> dict:
    return {"extra_data": {"benchmarks": {}}, "tests": list(tests)}


def test_a_check_starved_by_the_machine_is_to_be_graded_again() -> None:
    starved = {"number": "2.10", "status": "failed", "extra_data": {STARVED: [EVENT]}}
    hung = {"number": "2.9", "status": "failed", "extra_data": {}}
    found = timing_doubts({"sub_4": results(hung, starved), "sub_5": results(hung)})
    assert [(d["submission"], d["check"], d["passed"]) for d in found] == [("sub_4", "2.10", False)]
    assert found[0]["starved"] and "generate(prompt 3)" in found[0]["undecided"][0]
    assert "busy machine" in doubts_table(found) and "sub_4" in doubts_table(found)
    assert "| sub_4 | 2.10 | failed | generate(prompt 3) timed out" in doubts_markdown(found)


def test_a_malformed_record_is_not_listed() -> None:
    odd = {"number": "2.1", "status": "passed", "extra_data": {STARVED: "yes"}}
    assert timing_doubts({"sub_1": results(odd)}) == []
