"""Part 4's small judgements (grader/parts/part4/support.py): the worker's encoding
read back as plain Python, and what a generation that gave other tokens did."""

from __future__ import annotations

import math

from grader.parts.part4.support import generation_problem, plain_value


def test_plain_value_decodes_the_workers_encoding() -> None:
    enc = {
        "kind": "dict",
        "value": {
            "L": {"kind": "list", "value": [{"kind": "int", "value": 8}]},
            "x": {"kind": "list", "value": [{"kind": "float", "value": "nan"}]},
        },
    }
    value = plain_value(enc)
    assert value["L"] == [8] and math.isnan(value["x"][0])


def test_a_cached_generation_feeding_more_than_one_token_is_told() -> None:
    case = {"label": "lab model", "ids": [[1, 2, 3, 4]]}
    problem = generation_problem(case, True, 0, [4, 5, 6], lambda names: "")
    assert "forward received [4, 5, 6] tokens per call" in problem


def test_a_continuation_that_refeeds_the_prompt_is_named() -> None:
    case = {"label": "lab model", "ids": [[1, 2, 3, 4]]}
    problem = generation_problem(case, True, 2, [4, 1], lambda names: f"named {names}")
    assert "feed only the 2 it does not hold" in problem
    assert "named ['cache_from_refeeds_prompt']" in problem
