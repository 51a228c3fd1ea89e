"""Part 3 on the course's own Llama code, as students hand it in: the course's Phase-2
starter code with its `else` branches filled in (tests/submissions/course_part3/) and
the variants of tests/submissions/course_part3_variants.toml. Each lost check must be a
bug that is really in the code, and its feedback must name it."""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, Graded, built_once, load_graded, run_grade

# One pytest-xdist worker grades the four submissions; the other runs the short tests.
pytestmark = pytest.mark.xdist_group("course_part3")

SUBMISSIONS = ROOT / "tests" / "submissions"
VARIANTS = {
    v["name"]: v
    for v in tomllib.loads((SUBMISSIONS / "course_part3_variants.toml").read_text())["variant"]
}


def write_variant(dest: Path, name: str | None) -> Path:
    """The course-style submission, with variant ``name``'s edits (None: as handed in)."""
    shutil.copytree(
        SUBMISSIONS / "course_part3", dest, ignore=shutil.ignore_patterns("__pycache__")
    )
    for edit in VARIANTS[name]["edit"] if name else []:
        path = dest / edit["file"]
        text = path.read_text()
        assert text.count(edit["old"]) == 1, f"{name}: {edit['old']!r} must occur once"
        path.write_text(text.replace(edit["old"], edit["new"]))
    return dest


def grade_course_part3(factory: pytest.TempPathFactory, worker_id: str, name: str | None) -> Graded:
    def build(out: Path) -> None:
        run_grade(write_variant(out / "submission", name), out, parts=["part3"])

    return load_graded(built_once(factory, worker_id, f"course-part3-{name or 'template'}", build))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Graded:
    return grade_course_part3(tmp_path_factory, worker_id, None)


@pytest.fixture(scope="module")
def graded_variant(
    tmp_path_factory: pytest.TempPathFactory, worker_id: str
) -> Callable[[str], Graded]:
    """Variant name -> its grading (graded once, when first asked for)."""
    done: dict[str, Graded] = {}

    def get(name: str) -> Graded:
        if name not in done:
            done[name] = grade_course_part3(tmp_path_factory, worker_id, name)
        return done[name]

    return get


def lost(graded: Graded) -> dict[str, float]:
    return {
        t["number"]: t["score"] for t in graded.part_tests("part3") if t["score"] < t["max_score"]
    }


def test_template_loses_only_its_three_real_bugs(template: Graded) -> None:
    # The mask without start_pos columns (chunks at start_pos > 0), total_len not clamped
    # to max_seq_len, and no stop at <|eot_id|>: nothing else.
    assert set(lost(template)) == {"3.3", "3.4", "3.5", "3.9"}
    assert template.part_score("part3") == 21


def test_template_feedback_names_each_bug(template: Graded) -> None:
    # (3.4, hidden, names no cause: its sizes differ from the public probes'.)
    assert "without the start_pos columns" in template.output("3.3")
    assert "past max_seq_len = 128" in template.output("3.5")
    for number in ("3.5", "3.9"):
        assert "did not stop at <|eot_id|>" in template.output(number)


def test_template_is_told_how_it_was_built_and_judged(template: Graded) -> None:
    notes = template.output("3.1")
    assert "Your Llama has no build()" in notes
    assert "['use_scaled_rope']" in notes
    assert ".cuda() calls" in notes and "placed their tensors on cpu" in notes
    assert "no Llama 3.2 frequency scaling" in notes
    assert "no set_kv_caching" in notes
    assert "no Llama 3.2 frequency scaling" in template.output("3.2")


def test_no_check_blames_state_the_model_does_not_keep(template: Graded) -> None:
    assert template.score("3.8") == 2
    assert not [
        t["number"] for t in template.part_tests("part3") if "kept state" in t.get("output", "")
    ]


LOST = {
    # Correct course-style Phase-2 work loses nothing.
    "template_fixed": {},
    # BOS changes every text; the mask bug stays. 3.10 is judged by the logits the
    # model samples from, which it samples right: no second loss for the missing BOS.
    "bos_dropped": {
        "3.3": 2,
        "3.4": 2,
        "3.5": 0,
        "3.7": 0,
        "3.8": 0,
        "3.9": 0,
        "3.11": 0,
    },
    # Meta's layout (Transformer + a Llama(model, tokenizer) wrapper): the template's bugs.
    "meta_layout": {"3.3": 2, "3.4": 2, "3.5": 0, "3.9": 0},
    # Nothing builds, but sample_top_p needs no model.
    "lora_left_on": {f"3.{n}": 1 if n == 10 else 0 for n in range(1, 12)},
}


@pytest.mark.parametrize("name", sorted(LOST))
def test_each_variant_loses_exactly_what_its_bugs_cost(
    graded_variant: Callable[[str], Graded], name: str
) -> None:
    assert set(VARIANTS) == set(LOST)
    assert lost(graded_variant(name)) == LOST[name]


def test_bos_dropped_is_named_wherever_it_costs_points(
    graded_variant: Callable[[str], Graded],
) -> None:
    graded = graded_variant("bos_dropped")
    for number in ("3.5", "3.7", "3.8", "3.9", "3.11"):
        assert "encoded without BOS" in graded.output(number), number
    assert "kept state" not in graded.output("3.8")
    assert graded.score("3.10") == 2, graded.output("3.10")


def test_a_model_that_cannot_load_is_explained_once_where_it_stopped(
    graded_variant: Callable[[str], Graded],
) -> None:
    graded = graded_variant("lora_left_on")
    assert "Phase 3's LoRA layers are switched on" in graded.output("3.1")
    # The public models fail in 3.1 (every other model needs their tokenizer): every later
    # check points there, in one line; the hidden model is first built in 3.4, which
    # shows its failure whole.
    for number in ("3.2", "3.3", "3.5", "3.6", "3.7", "3.8", "3.9", "3.10", "3.11"):
        output = graded.output(number)
        assert "see check 3.1." in output and "lora_a" not in output, number
    assert "lora_a" in graded.output("3.4")


def test_the_named_causes_are_stored_as_ids_in_results_json(template: Graded) -> None:
    """Beside the text, results.json holds each failed check's named causes as stable ids
    (the catalogue's mutant names, or the course template's own), for reports to count."""
    causes = {t["number"]: t.get("extra_data", {}).get("causes") for t in template.data["tests"]}
    assert causes["3.3"] == ["mask_not_offset"]
    assert causes["3.5"] == ["past_max_seq_len", "no_eot_stop"]
    assert causes["3.9"] == ["no_eot_stop"]
    assert causes["3.1"] is None and causes["3.2"] is None  # passed checks name nothing
