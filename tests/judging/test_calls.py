"""grader/judging/calls.py: a cached generation's forward calls feed the prompt once (in
one call or in chunks), then one token per call."""

from __future__ import annotations

import pytest

from grader.judging.calls import fed_once, shown


@pytest.mark.parametrize(
    ("lengths", "prompt", "fine"),
    [
        ([8, 1, 1], 8, True),
        ([5, 3, 1, 1], 8, True),  # a chunked prefill
        ([8], 8, True),  # one new token: the prefill alone
        ([8, 1, 9, 1], 8, False),  # starts over
        ([8, 2, 2], 8, False),  # the last tokens again
        ([5, 5, 1], 8, False),  # a chunk past the prompt
        ([7], 8, False),  # part of the prompt never fed
        ([], 8, False),
    ],
)
def test_fed_once(lengths: list[int], prompt: int, fine: bool) -> None:
    assert fed_once(lengths, prompt) is fine


def test_long_records_are_cut_for_messages() -> None:
    assert shown([1, 2, 3]) == "[1, 2, 3]"
    assert shown(list(range(20)), most=3) == "[0, 1, 2, ...]"
    assert shown([1, 1]) == str([1, 1])  # numbers as Python writes them
    # Worded items are written as they are: no repr's quotes on a student's page.
    assert shown(["(0, 128)", "(128, 1)"]) == "[(0, 128), (128, 1)]"
