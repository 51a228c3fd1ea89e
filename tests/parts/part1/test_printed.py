"""Part 1 answers read from a course-style script's output, and judged from it.

The reading is pure (:mod:`grader.parts.part1.printed`); the judging of a read value
against sealed and plain answers is :mod:`grader.parts.part1.script`.
"""

from __future__ import annotations

import pytest

from grader.parts.part1 import build, printed_values
from grader.parts.part1.printed import Number, read_answers
from grader.parts.part1.script import _one, judge, target
from grader.parts.part1.seal import Verdict

COURSE_STYLE = """\
----- Question 1(a) Results -----
Total model parameters: 1.23 Billion
Memory in bytes: 2469135780
Total parameter memory: 2.30 GB
KV cache per request: 0.50 GB
Max batch size possible: 136
----- Question 1(b) Results -----
For Tensor Parallelism (TP) dimension X = 2:
Max batch size possible per GPU: 296
----- Question 1(d) Arithmetic Intensity -----
Arithmetic Intensity (Prefill) for N=1024, d=128: 12.34 FLOPs/byte
Arithmetic Intensity (Decode) for N=1024, d=128: 0.5 FLOPs/byte
"""


def values(text: str) -> dict[tuple, list[float]]:
    return {(r.key, r.where): [n.value for n in r.options] for r in read_answers(text).readings}


def test_the_course_format_is_read_by_label_with_headings_as_context() -> None:
    got = values(COURSE_STYLE)
    assert got[("params", ())] == [1.23e9]
    assert got[("weight_bytes", ())] == [2469135780]  # the exact bytes, finer than "2.30 GB"
    assert got[("kv_bytes", ())] == [0.5 * 2**30, 0.5e9]  # "GB" read both ways
    assert got[("max_batch", (("tp", 1),))] == [136]
    assert got[("max_batch", (("tp", 2),))] == [296]  # under the TP = 2 heading
    assert got[("ai_prefill", (("N", 1024), ("batch", 1), ("d", 128)))] == [12.34]


def test_tables_separators_and_scientific_notation() -> None:
    text = """\
| Metric | Value |
|---|---|
| Total parameters | 1,234,567,890 (1.23 B) |
| KV cache per request (GiB) | 0.125 |
| Max batch size (TP = 4) | 2,000 |
Prefill attention FLOPs\t5.36870912e8
Decode memory access = 528,640 bytes
"""
    got = values(text)
    assert got[("params", ())] == [1234567890]
    assert got[("kv_bytes", ())] == [0.125 * 2**30]
    assert got[("max_batch", (("tp", 4),))] == [2000]
    assert got[("flops_prefill", (("N", 1024), ("d", 128)))] == [536870912]
    assert got[("bytes_decode", (("N", 1024), ("d", 128)))] == [528640]


def test_one_answer_printed_with_two_values_is_unreadable_not_guessed() -> None:
    answers = read_answers("Max batch size: 136\nsome text\nMax batch size: 140\n")
    assert not answers.readings
    assert [u.why for u in answers.unreadable] == ["it is printed with different values"]
    fraction = read_answers("KV cache per request: 0.5\n")  # a byte figure with no unit
    assert "no unit" in fraction.unreadable[0].why


def test_a_line_printed_thousands_of_times_is_compared_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The output the grader reads (64 KB) repeats one answer, as a loop that prints it
    each step would: the reading is the same, and the grader compares the repeats once.
    Comparing every line with every other took 50 s of the grader's CPU for 64 KB of
    "KV: 1"."""
    text = COURSE_STYLE + "Total model parameters: 1.23 Billion\n" * 1600
    compared = []
    real = printed_values.agree
    monkeypatch.setattr(printed_values, "agree", lambda x, y: compared.append(1) or real(x, y))
    assert values(text) == values(COURSE_STYLE)
    assert len(compared) < 100


def test_only_the_write_ups_inputs_are_read_from_a_script() -> None:
    spec = {"__spec__": dict(n_layers=32, n_q_heads=32, n_kv_heads=8, d_model=4096,
                             d_ff=14336, vocab_size=128256)}  # fmt: skip
    one_gpu = {"func": "max_batch_size", "args": [spec, 80 * 2**30, 1024], "kwargs": {}}
    assert target(one_gpu) == ("max_batch", {"tp": 1})
    assert target({**one_gpu, "kwargs": {"tp": 2}}) == ("max_batch", {"tp": 2})
    assert target({**one_gpu, "args": [spec, 8 * 2**30, 1024]}) is None
    other = {"__spec__": {**spec["__spec__"], "n_layers": 16}}
    assert target({"func": "param_count", "args": [other], "kwargs": {}}) is None
    ai = {"func": "arithmetic_intensity", "args": [1024, 128, "decode"], "kwargs": {"batch": 8}}
    assert target(ai) == ("ai_decode", {"N": 1024, "d": 128, "batch": 8})


def test_a_rounded_value_is_judged_within_its_last_digit_and_never_beside_a_mistake() -> None:
    case = {"id": "t", "want": "float"}
    plain = Verdict(case, {"expected": 56.888889, "mistakes": {"half": 28.444444}}, 1e-6)
    assert judge({"": Number(56.89, 0.01, "56.89")}, plain).status == "right"
    assert judge({"": Number(56.80, 0.01, "56.80")}, plain).status == "wrong"
    named = judge({"": Number(28.44, 0.01, "28.44")}, plain)
    assert (named.status, named.mistakes) == ("wrong", ["half"])
    close = Verdict(case, {"expected": 100.0, "mistakes": {"near": 100.3}}, 1e-6)
    assert judge({"": Number(100.0, 1.0, "100")}, close).status == "coarse"


def test_the_self_check_compares_full_values_through_the_seals_and_says_when_it_cannot() -> None:
    plain = {"check": "1.4", "label": "t", "func": "max_batch_size", "args": [], "kwargs": {}}
    case = build.sealed({**plain, "want": "int", "expected": 520, "mistakes": {"mha": 130}})
    sealed = Verdict(case, None, 1e-6)
    assert judge({"": Number(520, 1.0, "520")}, sealed).status == "right"
    assert judge({"": Number(130, 1.0, "130")}, sealed).mistakes == ["mha"]
    assert judge({"": Number(5.2e2, 10.0, "5.2e2")}, sealed).status == "unchecked"


def replaced(old: str, new: str) -> str:
    assert COURSE_STYLE.count(old) == 1, old
    return COURSE_STYLE.replace(old, new)


ONE_GPU = "Max batch size possible: 136"
TOO_LARGE = "is not a number we can read (too large, or too many digits)"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("1e400", f"'1e400' {TOO_LARGE}"),
        ("9" * 5000, f"{'9' * 40!r} {TOO_LARGE}"),  # float("9" * 5000) is inf
        ("1e" + "9" * 5000, f"{'1e' + '9' * 38!r} {TOO_LARGE}"),  # int() refuses it
        ("nan", "'nan' is not a number we can read (not a finite number)"),
        ("-inf", "'-inf' is not a number we can read (not a finite number)"),
        ("Infinity", "'Infinity' is not a number we can read (not a finite number)"),
    ],
    ids=["1e400", "5000-digits", "5000-digit-exponent", "nan", "-inf", "Infinity"],
)
def test_a_number_past_what_a_float_holds_is_unreadable_and_the_rest_is_read(
    value: str, why: str
) -> None:
    """Its line is "not a number we can read", never an exception (``1e400`` overflowed
    and took all of Part 1's checks with it); every other answer is read as before."""
    answers = read_answers(replaced(ONE_GPU, f"Max batch size possible: {value}"))
    assert [(u.key, u.where, u.why) for u in answers.unreadable] == [
        ("max_batch", (("tp", 1),), why)
    ]
    expected = values(COURSE_STYLE)
    del expected[("max_batch", (("tp", 1),))]
    assert values(replaced(ONE_GPU, f"Max batch size possible: {value}")) == expected


def test_negative_zero_tiny_and_too_large_in_their_unit() -> None:
    assert values(replaced(ONE_GPU, "Max batch size possible: -0"))[
        ("max_batch", (("tp", 1),))
    ] == [0]
    tiny = read_answers("Total model parameters: 1e-400\n").readings[0].options[0]
    assert (tiny.value, tiny.step) == (0.0, 0.0)  # below a float's range: zero, no error
    huge = read_answers("KV cache per request: 1e300 TiB\n").unreadable
    assert [u.why for u in huge] == [
        "'1e300 TiB' is not a number we can read (too large in its unit)"
    ]


def test_an_input_in_a_label_too_long_to_be_one_is_named_not_guessed() -> None:
    """A TP degree or an N of thousands of digits is no input of the write-up: its line is
    not read as the answer for the write-up's (Python would refuse to read such an int);
    under such a heading, the lines below take the write-up's inputs."""
    digits = "2" * 5000
    answers = read_answers(f"Max batch size (TP = {digits}): 5\n")
    assert [(u.key, u.why) for u in answers.unreadable] == [
        ("max_batch", "its TP degree is not a number we can read")
    ]
    line = f"Arithmetic Intensity (Prefill) for N={digits}, d=128: 12.34 FLOPs/byte\n"
    assert [u.why for u in read_answers(line).unreadable] == ["its N is not a number we can read"]
    heading = f"----- N = {digits} -----\nArithmetic Intensity (Prefill): 12.34 FLOPs/byte\n"
    assert values(heading) == {("ai_prefill", (("N", 1024), ("batch", 1), ("d", 128))): [12.34]}


def test_an_unreadable_number_is_named_in_its_check() -> None:
    answers = read_answers(replaced(ONE_GPU, "Max batch size possible: 1e400"))
    assert _one(answers, "max_batch", {"tp": 1}) == (
        "the line 'Max batch size possible: 1e400' cannot be read unambiguously "
        f"('1e400' {TOO_LARGE})"
    )
