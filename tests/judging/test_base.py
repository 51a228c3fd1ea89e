"""grader/judging/base.py: what every check shares."""

from __future__ import annotations

import sys

import pytest

from grader.judging.base import Outcome


@pytest.mark.parametrize(
    ("failures", "most", "tail"),
    [
        (0, 3, None),
        (3, 3, None),
        (4, 3, "(and 1 more failing case)"),
        (9, 3, "(and 6 more failing cases)"),
        (2, 1, "(and 1 more failing case)"),
    ],
)
def test_a_cut_list_of_failures_says_how_many_more(failures: int, most: int, tail) -> None:
    outcome = Outcome(failures=[f"case {i} is wrong" for i in range(failures)])
    lines = outcome.listing(most).text().splitlines()
    shown = [x for x in lines if x.startswith("case ")]
    assert shown == [f"case {i} is wrong" for i in range(min(failures, most))]
    assert (lines[-1] if len(lines) > len(shown) else None) == tail


def test_every_part_lists_its_failures_through_the_one_helper() -> None:
    """No part cuts a list of failures by hand (a cut that does not say so)."""
    from grader.core.paths import PACKAGE

    for path in (PACKAGE / "parts").rglob("*.py"):
        assert "failures[:" not in path.read_text(), path


def test_a_yardstick_that_fails_ahead_is_timed_again_by_the_check_that_asks() -> None:
    """Timed ahead of the part's worker, a failed reference run is not kept: the check
    that compares times it again and fails with the reason, where the student sees it."""
    import types

    from grader.judging.base import GradedTestCase

    runs: list[str] = []

    class Probe(GradedTestCase):
        part = "part2"
        ctx = types.SimpleNamespace(scratch={})

        def _time_reference(self):
            runs.append("timed")
            if len(runs) == 1:
                self.fail("Grader fault: the reference solution's own timed run failed (x).")
            return {"work": {"with the cache": "timing"}}

        def runTest(self) -> None:
            pass

    probe = Probe()
    probe.time_yardstick_ahead()  # fails: nothing kept, nothing raised
    assert "part2.yardstick" not in probe.ctx.scratch
    assert probe.yardstick("work") == {"with the cache": "timing"}
    probe.time_yardstick_ahead()  # kept: not timed a third time
    assert probe.yardstick("work") == {"with the cache": "timing"} and runs == ["timed"] * 2


def test_a_check_hands_over_its_items_even_when_it_said_nothing() -> None:
    """A benchmark that passed printed only its measurements (drawn from its record as
    tables): its items are handed over empty, so its page is its verdict and tables, not
    the printed lines; the lines it printed for the page lead its items."""
    import contextlib
    import io
    import types

    from grader.core.feedback import feedback_blocks
    from grader.core.feedback_items import ITEMS
    from grader.core.results import TestResult
    from grader.judging.base import GradedTestCase

    class Timed(GradedTestCase):
        part = "part2"

        def test_it(self) -> None:
            """2.11 timed"""

    def run(said: str, unsaid: str) -> dict:
        check = Timed("test_it")
        check.ctx = types.SimpleNamespace(scratch={})
        check.setUp()
        with contextlib.redirect_stdout(io.StringIO()):
            print("\n".join(x for x in (said, unsaid) if x))
            check.unsaid.add(unsaid)
            check.tearDown()
        return next(iter(check.ctx.scratch["details"].values()))[ITEMS]

    items = run("", "  with the cache: median 65.2 ms")
    assert items["lead"] == [] and items["cases"] == []
    test = TestResult("2.11 timed", 3, 3, "passed", "2.11", "  with the cache: median 65.2 ms",
                      ["part2"], extra_data={ITEMS: items})  # fmt: skip
    assert [b["kind"] for b in feedback_blocks(test, None, "cpu")] == ["paragraph"]  # verdict
    assert run("Note: the yardstick was not measured.", "  x")["lead"] == [
        "Note: the yardstick was not measured."
    ]


def test_a_title_that_names_its_parts_constants_needs_them_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2.1's title states the public model's sizes from Part 2's cases: declared where that
    module is not imported, the check says what to do instead of a formatter's error."""
    import grader.parts.part2.cases as cases
    from grader.judging.base import check

    def runTest(self) -> None:
        pass

    assert str(cases.PUBLIC_MODEL["config"]["d_model"]) in check("2.1")(runTest).__doc__
    monkeypatch.delitem(sys.modules, "grader.parts.part2.cases")
    with pytest.raises(RuntimeError, match="imports its cases first"):
        check("2.1")(runTest)
