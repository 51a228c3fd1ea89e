"""grader/core/terminal.py: what a grading prints to a terminal."""

from __future__ import annotations

from grader.core.results import GradingResults, TestResult
from grader.core.terminal import failure_details, score_table, terminal_report, terminal_safe

#: What a hostile submission prints: clear the screen, a forged green PASS line, an OSC 52
#: clipboard write, a C1 control.
HOSTILE = "\x1b[2J\x1b[32mPASS 2.1 100/100\x1b[0m\x1b]52;c;cm0gLXJmIH4=\x07\x9b"


def test_control_characters_are_shown_not_obeyed() -> None:
    safe = terminal_safe(HOSTILE)
    assert not [c for c in safe if ord(c) < 32 or 0x7F <= ord(c) <= 0x9F]
    assert safe.startswith("\\x1b[2J") and "\\x07" in safe and safe.endswith("\\x9b")


def test_newlines_tabs_and_text_are_kept() -> None:
    assert terminal_safe("a\tb\nc é ✓") == "a\tb\nc é ✓"


def test_the_details_of_a_failed_check_are_terminal_safe() -> None:
    failed = TestResult("2.1 forward", 0, 2, "failed", "2.1", f"Got: {HOSTILE}", ["part2"])
    details = failure_details(GradingResults(tests=[failed]))
    assert "\x1b" not in details and "\\x1b[32mPASS" in details
    assert details.startswith("[2.1] forward\nFailed: 0 / 2 points.\nGot: ")


def test_the_terminal_report_is_the_table_then_the_feedback_after_a_blank_line() -> None:
    failed = TestResult("2.1 forward", 0, 2, "failed", "2.1", "wrong logits", ["part2"])
    results = GradingResults(tests=[failed])
    report = terminal_report(results, details=True)
    table, feedback = report.split("\n\n", 1)
    assert table == score_table(results)
    assert feedback.startswith("[2.1] forward\nFailed: 0 / 2 points.\nwrong logits\nTry: ")
    assert terminal_report(results, details=False) == table
    empty = GradingResults(tests=[], output="question1.py \x1b[2J was not found")
    assert terminal_report(empty, details=True) == "question1.py \\x1b[2J was not found"


def test_points_stay_in_one_column_whatever_the_fraction() -> None:
    """A fractional score (0.375, 2.6875) keeps the points' column where a whole one has it."""
    tests = [
        TestResult(f"2.{i} check", score, 4, "failed", f"2.{i}", "", ["part2"])
        for i, score in enumerate([0, 0.375, 2.6875, 4], start=1)
    ]
    rows = [
        line for line in score_table(GradingResults(tests=tests)).splitlines() if "  2." in line
    ]
    assert len(rows) == 4
    assert len({row.index(" / ") for row in rows}) == 1, rows
    assert all(len(row) <= 110 for row in rows)


def test_the_pages_notes_come_before_the_table_terminal_safe() -> None:
    """What the top of the Gradescope page says about the files (supplied, moved, missing)
    is what a terminal shows first too; anything but a list of notes shows none."""
    passed = TestResult("2.1 forward", 2, 2, "passed", "2.1", "", ["part2"])
    notes = ["Uploaded without their folder, graded in it: \x1b[2Jmodel.py -> llama/model.py."]
    results = GradingResults(tests=[passed], extra_data={"notes": notes})
    head, table = terminal_report(results, details=False).split("\n\n", 1)
    assert head == notes[0].replace("\x1b", "\\x1b")
    assert table == score_table(results)
    forged = GradingResults(tests=[passed], extra_data={"notes": "not a list"})
    assert terminal_report(forged, details=False) == score_table(forged)
