"""The mistake census: which named causes a class made, counted from results files."""

from __future__ import annotations

from typing import Any

from grader.ta.regrade.census import census, census_markdown, census_records
from grader.ta.regrade.class_page import census_table


def failed(number: str, *causes: str) -> dict[str, Any]:
    return {
        "number": number,
        "name": f"{number} a check",
        "status": "failed",
        "output": "Failed.",
        "extra_data": {"causes": list(causes)},
    }


def test_the_checks_that_named_a_cause_are_listed_in_check_order() -> None:
    """1.3 before 1.10 and 1.12 in every view (not the text order 1.10, 1.12, 1.3)."""
    results = {
        "submission_1": {"tests": [failed(n, "kv_missing_factor_2") for n in ("1.10", "1.3")]},
        "submission_2": {"tests": [failed(n, "kv_missing_factor_2") for n in ("1.12", "1.4")]},
    }
    causes = census(results)
    order = ["1.3", "1.4", "1.10", "1.12"]
    assert list(causes[0].checks) == order
    assert list(census_records(causes, 2)[0]["checks"]) == order
    assert "1.3 (1), 1.4 (1), 1.10 (1), 1.12 (1)" in census_markdown(causes, 2)
    assert "1.3 (1), 1.4 (1), 1.10 (1), 1.12 (1)" in census_table(causes)


def test_isolated_causes_are_counted_beside_known_mistakes() -> None:
    """A cause the grader narrowed by experiment (an ``isolated:`` id) is counted as a
    known mistake is, and every view says which kind it is."""
    results = {
        "submission_1": {"tests": [failed("1.3", "isolated:ignores_bytes_per_elem")]},
        "submission_2": {"tests": [failed("1.3", "isolated:ignores_bytes_per_elem")]},
        "submission_3": {"tests": [failed("1.3", "kv_missing_factor_2")]},
    }
    causes = census(results)
    assert [(c.cause, c.kind, c.count) for c in causes] == [
        ("isolated:ignores_bytes_per_elem", "isolated", 2),
        ("kv_missing_factor_2", "known", 1),
    ]
    records = census_records(causes, 3)
    assert [r["kind"] for r in records] == ["isolated", "known"]
    assert "| `isolated:ignores_bytes_per_elem` | isolated | 2 |" in census_markdown(causes, 3)
    assert "<td>isolated</td>" in census_table(causes)
