"""Knock-on failures in Part 1: a wrong value that follows from another function's points
back to that function's check, and one that does not is left alone."""

from __future__ import annotations

from grader.parts.part1.knock_on import Call, derivation, follows_from, knock_on_sentence

SPEC = {"__spec__": {"n_layers": 2, "n_q_heads": 4, "n_kv_heads": 2, "d_model": 64, "d_ff": 128,
                     "vocab_size": 100, "bytes_per_param": 4}}  # fmt: skip
DECODE_BYTES = "    return float((2 * d + 2 * N * d + 4 * N) * bpe)"
PREFILL_BYTES = "        return float((4 * N * N + 4 * N * d) * bpe)"
FIX_BYTES = "This follows from 1.7's attention_bytes; fix that first."


def test_a_call_is_the_same_however_its_arguments_are_passed() -> None:
    assert Call("kv_cache_bytes_per_request", (SPEC, 1024)).key() == (
        Call("kv_cache_bytes_per_request", (SPEC,), (("context_len", 1024),)).key()
    )
    assert Call("kv_cache_bytes_per_request", (SPEC, 1024)).key() == (
        Call("kv_cache_bytes_per_request", (SPEC, 1024, 2)).key()
    )
    assert Call("max_batch_size", (SPEC, 8, 1024), (("tp", 2),)).check() == "1.5"
    assert Call("max_batch_size", (SPEC, 8, 1024)).check() == "1.4"


def test_the_calls_a_value_is_computed_from() -> None:
    uses, formula = derivation(Call("max_batch_size", (SPEC, 1000, 16), (("tp", 2),)))
    assert [c.func for c in uses] == ["weight_bytes", "kv_cache_bytes_per_request"]
    assert uses[1].bound()["bytes_per_elem"] == 4  # the cache in the weights' precision
    assert formula([400, 100]) == 16
    uses, formula = derivation(Call("weight_bytes", (SPEC,)))
    assert formula([10]) == 40
    assert derivation(Call("param_count", (SPEC,))) is None


def test_only_a_value_rebuilt_from_the_students_own_values_is_a_knock_on() -> None:
    uses = derivation(Call("arithmetic_intensity", (1024, 128, "prefill")))
    own = {"attention_flops": 8.0, "attention_bytes": 2.0}
    right = {"attention_flops": True, "attention_bytes": False}

    def follows(got: float, judged: dict[str, bool | None]) -> list[str]:
        calls = follows_from(got, uses, lambda c: own[c.func], lambda c, v: judged[c.func], 1e-6)
        return [c.func for c in calls]

    assert follows(4.0, right) == ["attention_bytes"]
    assert follows(4.1, right) == []  # wrong on its own: the ratio is not what it returned
    unknown = {"attention_flops": None, "attention_bytes": None}
    assert follows(4.0, unknown) == ["attention_flops", "attention_bytes"]
    assert knock_on_sentence(uses[0]) == (
        "This follows from 1.6's attention_flops and 1.7's attention_bytes; fix those first."
    )


def test_a_wrong_attention_bytes_is_pointed_back_to_from_1_8_1_9_and_1_10(grade_patched) -> None:
    """The decode bytes without the round trip of S and P: 1.7 fails on its own, and 1.8,
    1.9 and every cell of 1.10 built on it say where to look."""
    graded = grade_patched([(DECODE_BYTES, DECODE_BYTES.replace("4 * N", "2 * N"))])
    assert graded.score("1.7") == 0 and FIX_BYTES not in graded.output("1.7")
    for number in ("1.8", "1.9"):
        assert graded.score(number) == 0
        assert FIX_BYTES in graded.output(number), number
    assert "ai_decode follows from 1.8's arithmetic_intensity; fix that first." in (
        graded.output("1.10")
    )


def test_an_intensity_wrong_on_its_own_is_not_blamed_on_the_bytes(grade_patched) -> None:
    """Wrong bytes and an intensity that is not their ratio: 1.8 names no knock-on."""
    ratio = "    return (batch * attention_flops(N, d, phase)) / (batch * attention_bytes("
    graded = grade_patched(
        [(PREFILL_BYTES, PREFILL_BYTES.replace("4 * N * d", "3 * N * d")),
         (ratio, ratio.replace("return (", "return 1.01 * ("))]
    )  # fmt: skip
    assert graded.score("1.8") == 0
    assert "follows from" not in graded.output("1.8")


def test_a_wrong_parameter_count_is_pointed_back_to_from_the_memory_checks(grade_patched) -> None:
    """An embedding counted twice (no known mistake): the checks built on the count say
    where to look."""
    graded = grade_patched(
        [("embedding = spec.vocab_size * d", "embedding = 2 * spec.vocab_size * d")]
    )
    assert "This follows from 1.1's param_count; fix that first." in graded.output("1.2")
    assert "This follows from 1.2's weight_bytes; fix that first." in graded.output("1.5")
    assert "This follows from 1.2's weight_bytes; fix that first." in graded.output("1.4")
    assert "follows from 1.1's param_count" not in graded.output("1.1")
