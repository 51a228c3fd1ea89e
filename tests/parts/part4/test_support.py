"""Part 4's small judgements (grader/parts/part4/support.py): the worker's encoding
read back as plain Python, and what a generation that gave other tokens did."""

from __future__ import annotations

import math
import random
import re
import threading

from grader.parts.part4.support import (
    FOR_WORD,
    IN_WORD,
    WrongValue,
    generation_problem,
    in_order,
    plain_value,
    summarise_wrong_values,
)


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
    problem = generation_problem(case, True, 0, [4, 5, 6], lambda names: "").sentence()
    assert "forward received [4, 5, 6] tokens per call" in problem


def test_a_continuation_that_refeeds_the_prompt_is_named() -> None:
    case = {"label": "lab model", "ids": [[1, 2, 3, 4]]}
    problem = generation_problem(case, True, 2, [4, 1], lambda names: f" named {names}")
    problem = problem.sentence()
    assert "feed only the 2 it does not hold" in problem
    assert "named ['cache_from_refeeds_prompt']" in problem


def test_wrong_values_one_mistake_explains_are_summarised_once() -> None:
    wrong = [
        WrongValue(f"theoretical_kv_bytes({L}, 768, 6, 2)", L * 768 * 6 * 2,
                   {"theory_without_factor_2": L * 768 * 6 * 2})
        for L in (10, 20, 30)
    ]  # fmt: skip
    lines, names = summarise_wrong_values(wrong, 16)
    assert names == ["theory_without_factor_2"]
    assert lines == [
        "3 of 16 cases returned a wrong value, all wrong in the same way; "
        "e.g. theoretical_kv_bytes(10, 768, 6, 2) returned 92,160."
    ]


def test_wrong_values_no_mistake_explains_name_none() -> None:
    wrong = [
        WrongValue("f(1)", 5, {"theory_without_factor_2": 5}),
        WrongValue("f(2)", 7, {"theory_without_factor_2": 8}),
    ]
    lines, names = summarise_wrong_values(wrong, 4)
    assert names == []
    assert [c.sentence() for c in lines] == [
        "f(1) returned 5, which is wrong (compared exactly).",
        "f(2) returned 7, which is wrong (compared exactly).",
    ]


def test_the_cache_loop_hints_read_source_lines_as_their_expressions_did() -> None:
    """The lab's loop over the cache is found in the student's traceback lines in order
    (``for``, then a comma, then ``in``; or ``for``, ``in``, then ``past`` or ``cache``), as
    the expressions it replaced found it, on a seeded corpus of the pieces, and in one
    pass over a line of 100,000 pieces (those expressions backtracked for seconds on
    5,000 characters). The thread only bounds the test on a grader that backtracks."""
    loop_with_comma = re.compile(r"\bfor\b.*,.*\bin\b")
    loop_over_cache = re.compile(r"\bfor\b.*\bin\b.*(past|cache)")
    rng = random.Random(0)
    pieces = ["for", " ", ",", "in", "past", "cache", "x", "fo", "rin", "_", "inpast"]
    for _ in range(50_000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        assert in_order(line, FOR_WORD, ",", IN_WORD) == bool(loop_with_comma.search(line))
        over = in_order(line, FOR_WORD, IN_WORD, "past") or in_order(
            line, FOR_WORD, IN_WORD, "cache"
        )
        assert over == bool(loop_over_cache.search(line)), line
    read = []
    long_line = "for ," * 100_000
    worker = threading.Thread(
        target=lambda: read.append(in_order(long_line, FOR_WORD, IN_WORD, "cache")), daemon=True
    )
    worker.start()
    worker.join(timeout=60)
    assert read == [False]
