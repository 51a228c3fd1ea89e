"""Sealed Part 1 answers: the public cases judge values as the plain ones do, hold no
answer, and the hidden file holds every answer for the autograder."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from grader.core.paths import TEST_CASES
from grader.parts.part1 import seal
from grader.parts.part1.seal import Verdict

PUBLIC = json.loads((TEST_CASES / "public" / "part1.json").read_text())
HIDDEN = json.loads((TEST_CASES / "hidden" / "part1.json").read_text())
REL_TOL = PUBLIC["rel_tol"]


def sealed_cases() -> list[dict[str, Any]]:
    return [c for c in PUBLIC["cases"] if "sealed" in c]


def test_every_write_up_case_is_sealed_and_answered_in_the_hidden_file() -> None:
    cases = [c for c in PUBLIC["cases"] if not c.get("own_input")]
    assert cases and all("sealed" in c and "expected" not in c for c in cases)
    assert {c["id"] for c in cases} == set(HIDDEN["answers"])
    assert "answers" not in PUBLIC


def test_every_searchable_check_has_an_input_of_its_own_public_and_hidden() -> None:
    """1.1 to 1.7's write-up answers are integers a search finds against the seals: each
    of these checks also has a public input of its own (its answer shown) and a hidden
    one, so an answer written in for the write-up's inputs cannot pass the check."""
    checks = [f"1.{n}" for n in range(1, 8)]
    own = [c for c in PUBLIC["cases"] if c.get("own_input")]
    assert sorted(c["check"] for c in own) == checks
    assert all("expected" in c and "sealed" not in c for c in own)
    hidden = [c for c in HIDDEN["cases"] if c["label"] == "hidden input"]
    assert sorted(c["check"] for c in hidden) == checks
    write_up = {json.dumps(c["args"]) for c in PUBLIC["cases"] if not c.get("own_input")}
    assert not write_up & {json.dumps(c["args"]) for c in [*own, *hidden]}


def test_the_hidden_answers_are_the_handouts_figures() -> None:
    answers = HIDDEN["answers"]
    assert answers["1.1 LLaMA-3-8B"]["expected"] == 8_030_261_248
    assert answers["1.4 LLaMA-3-8B, 80 GiB, context 1024"]["expected"] == 520
    assert answers["1.5 LLaMA-3-8B, TP = 2"]["expected"] == 1160
    assert round(answers["1.8 N=1024, d=128, prefill"]["expected"], 2) == 56.89


@pytest.mark.parametrize("case", sealed_cases(), ids=lambda c: c["id"])
def test_sealed_verdicts_equal_the_plain_ones_on_every_catalogued_mistake(
    case: dict[str, Any],
) -> None:
    """The mistakes catalogue holds every Part 1 mutant's value wherever it differs from
    the reference's: through the seals each is wrong and named, as in plain form, and the
    reference's own value is right."""
    answer = HIDDEN["answers"][case["id"]]
    plain, sealed = Verdict(case, answer, REL_TOL), Verdict(case, None, REL_TOL)
    assert sealed.kinds() == plain.kinds()
    assert sealed.right(answer["expected"]) and plain.right(answer["expected"])
    assert sealed.mistakes(answer["expected"]) == plain.mistakes(answer["expected"])
    for name, value in answer["mistakes"].items():
        assert not sealed.right(value), name
        assert sealed.mistakes(value) == plain.mistakes(value), name
        assert name in sealed.mistakes(value), name
        if isinstance(value, dict):
            assert sealed.wrong_entries(value) == plain.wrong_entries(value), name


def test_a_float_is_accepted_within_the_tolerance_and_not_beyond_twice_it() -> None:
    x = 56.888888888888886
    sealed = seal.seal(x, "t", "expected", REL_TOL)
    for factor in (1.0, 1 + 0.999 * REL_TOL, 1 - 0.999 * REL_TOL, 1 + 1e-15):
        y = x * factor
        assert math.isclose(y, x, rel_tol=REL_TOL)
        assert seal.matches(y, sealed, "t", "expected", REL_TOL), factor
    for factor in (1 + 2.01 * REL_TOL, 1 - 2.01 * REL_TOL, 2.0, -1.0):
        assert not seal.matches(x * factor, sealed, "t", "expected", REL_TOL), factor
    assert not seal.matches(math.nan, sealed, "t", "expected", REL_TOL)
    assert not seal.matches(math.inf, sealed, "t", "expected", REL_TOL)


def test_every_value_isclose_accepts_is_accepted() -> None:
    """At the very edge of ``math.isclose`` on either side, for values across magnitudes."""
    for x in (0.983669548511047, 0.125, 14.957527160644531, 5.36870912e8, 3.1e-7):
        sealed = seal.seal(x, "edge", "expected", REL_TOL)
        for y in (x * (1 - REL_TOL), x / (1 - REL_TOL)):
            y = y if math.isclose(y, x, rel_tol=REL_TOL) else math.nextafter(y, x)
            assert math.isclose(y, x, rel_tol=REL_TOL)
            assert seal.matches(y, sealed, "edge", "expected", REL_TOL), (x, y)


def test_integers_match_exactly_and_only_as_integers() -> None:
    sealed = seal.seal(520, "t", "expected", REL_TOL)
    assert seal.matches(520, sealed, "t", "expected", REL_TOL)
    for other in (519, 521, 520.0, True, "520", None):
        assert not seal.matches(other, sealed, "t", "expected", REL_TOL), other
    zero = seal.seal(0.0, "t", "expected", REL_TOL)
    assert seal.matches(0.0, zero, "t", "expected", REL_TOL)
    assert seal.matches(1e-13, zero, "t", "expected", REL_TOL)


def test_salts_differ_by_case_role_and_entry() -> None:
    """Equal values sealed for two cases, two roles or two entries do not look equal."""
    seals = {
        json.dumps(seal.seal(520, "a", "expected", REL_TOL)),
        json.dumps(seal.seal(520, "b", "expected", REL_TOL)),
        json.dumps(seal.seal(520, "a", "mha_kv_cache", REL_TOL)),
    }
    assert len(seals) == 3
    table = seal.seal({"x": 1, "y": 1}, "a", "expected", REL_TOL)["table"]
    assert table["x"] != table["y"]
    assert seal.seal(0.5, "a", "expected", REL_TOL) == seal.seal(0.5, "a", "expected", REL_TOL)


def test_a_table_is_right_only_with_every_entry_and_the_same_keys() -> None:
    want = {"n": 520, "ai": 0.983669548511047}
    case = {"id": "t", "sealed": {"expected": seal.seal(want, "t", "expected", REL_TOL)}}
    case["sealed"]["mistakes"] = {}
    verdict = Verdict(case, None, REL_TOL)
    assert verdict.kinds() == {"n": "int", "ai": "float"}
    assert verdict.right(dict(want))
    assert not verdict.right({**want, "n": 521})
    assert not verdict.right({**want, "extra": 1})
    assert verdict.wrong_entries({**want, "n": 521, "ai": 1.0}) == ["n", "ai"]


def test_part1_regeneration_is_deterministic_and_matches_the_committed_files(
    tmp_path,
) -> None:
    """Salts come from case ids, so the seals are the same bytes on every regeneration."""
    from grader.ta import regen

    for out in ("a", "b"):
        regen.write_cases(tmp_path / out, parts=["part1"])
    for rel in ("public/part1.json", "hidden/part1.json"):
        fresh = (tmp_path / "a" / rel).read_bytes()
        assert fresh == (tmp_path / "b" / rel).read_bytes(), rel
        assert fresh == (TEST_CASES / rel).read_bytes(), rel
