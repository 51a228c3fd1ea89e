"""Every known mistake is caught (loses points) and named in the feedback; every
correct variant written differently keeps full marks."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.core.points import bonus_total
from grader.core.registry import PARTS
from grader.runtime.context import load_cases
from grader.ta.mutants import Mutant, MutantVerdict, load_mutants, run_mutants
from tests.conftest import SOLUTION

LIBRARY_PARTS = ["part1", "part2", "part3", "part4"]
MIN_MUTANTS = {"part1": 10, "part2": 10, "part3": 9, "part4": 13}  # what each issue asked for
MUTANTS = [m for p in LIBRARY_PARTS for m in load_mutants(p)]
VARIANTS = [v for p in LIBRARY_PARTS for v in load_mutants(p, variants=True)]


@pytest.mark.parametrize("part", LIBRARY_PARTS)
def test_library_is_large_and_names_are_unique(part: str) -> None:
    names = [m.name for m in load_mutants(part) + load_mutants(part, variants=True)]
    assert len(load_mutants(part)) >= MIN_MUTANTS[part]
    assert len(set(names)) == len(names)
    assert all(m.diagnosis for m in load_mutants(part))


@pytest.mark.parametrize("mutant", MUTANTS + VARIANTS, ids=lambda m: m.name)
def test_mutant_applies_to_the_solution(mutant) -> None:
    source = (SOLUTION / mutant.file).read_text()
    changed = mutant.apply(source)
    assert changed != source
    compile(changed, mutant.file, "exec")
    assert Path(PARTS[mutant.part].main_file).parent == Path(mutant.file).parent


def test_every_cache_layout_is_graded_with_the_benchmarks() -> None:
    """Each way of keeping the cache that the benchmark probes must accept is a correct
    variant graded with them: Meta's preallocated cache, one grown with torch.cat or copied
    at every step, per-layer pairs handed through the layers, a closure, a helper module, a
    parameter list, a rotating deque (Part 3); a buffer allocated on first use or with the
    model, a copy at every call, six containers deep, a helper module, an lru_cache, a
    decorator's closure (Part 2)."""
    timed = {(v.part, v.name) for v in VARIANTS if v.timed}
    assert {("part3", n) for n in ("eager_cache", "cat_grown_cache", "cloned_cache_per_step",
                                   "cache_passed_through_layers", "cache_in_closure",
                                   "cache_in_helper_module", "cache_in_parameter_list",
                                   "cache_in_rotating_deque")} <= timed  # fmt: skip
    assert {("part2", n) for n in ("preallocated_cache", "cloned_cache_per_step",
                                   "eager_cache_on_layers", "cache_nested_in_dataclass",
                                   "cache_in_helper_module", "cache_in_lru_store",
                                   "cache_in_decorator_closure")} <= timed  # fmt: skip


@pytest.mark.parametrize("part", LIBRARY_PARTS)
def test_the_stored_catalogue_is_the_librarys(part: str) -> None:
    """The committed cases' diagnosis catalogue, whose texts name a mistake on a student's
    page, holds every single mistake of the library, worded as the library words it, and
    no other: an entry added, reworded or removed without ``python -m grader regen`` fails
    here at once and by name (the drift test finds it too, after regenerating every part;
    Part 2's stored signatures: ``test_part2_catalogue_names_every_mutant_somewhere``)."""
    stored = load_cases(part)["diagnoses"]
    library = {m.name: m.diagnosis for m in load_mutants(part, combined=False)}
    missing = sorted(library.keys() - stored.keys())
    gone = sorted(stored.keys() - library.keys())
    stale = sorted(n for n in library.keys() & stored.keys() if stored[n] != library[n])
    assert not (missing or gone or stale), (
        f"run `python -m grader regen --parts {part}`: not in the stored catalogue {missing}, "
        f"no longer in the library {gone}, worded otherwise in the library {stale}"
    )


def test_a_stale_edit_is_refused() -> None:
    mutant = load_mutants("part2")[0]
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutant.apply("nothing to mutate here")


@pytest.mark.mutants
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: f"{m.part}-{m.name}")
def test_every_mutant_is_caught_and_named(mutant) -> None:
    """Graded without the timed benchmarks first (they cost most of the time); a mutant
    only the benchmark can catch, such as a cache-free path disguised as cached, is graded
    again with them and must be caught there."""
    (verdict,) = run_mutants([mutant.part], names=[mutant.name], benchmarks=False)
    if not verdict.ok:
        (verdict,) = run_mutants([mutant.part], names=[mutant.name])
    assert verdict.caught, f"{mutant.name} keeps {verdict.score:g} / {verdict.max_score:g}"
    assert verdict.named, f"{mutant.name}: the feedback does not name {mutant.diagnoses}"


@pytest.mark.mutants
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda m: f"{m.part}-{m.name}")
def test_every_correct_variant_keeps_full_marks(variant) -> None:
    """Graded without the timed benchmarks, but for the variants marked ``timed`` (a cache
    kept another way than the reference's), whose benchmark checks look at the cache."""
    (verdict,) = run_mutants([variant.part], names=[variant.name], benchmarks=variant.timed)
    assert verdict.mutant.variant and verdict.ok, (variant.name, verdict.score)


def test_a_correct_variant_is_at_full_marks_only_with_the_bonus_the_reference_earns() -> None:
    """Part 4's reference earns the int8 bonus: a variant scoring the checks' maximum and
    the bonus keeps full marks; one that lost the bonus did lose points."""
    assert bonus_total("part4") > 0
    variant = Mutant("v", "part4", "kv_lab.py", (), variant=True)
    top = 17.0
    assert MutantVerdict(variant, top + bonus_total("part4"), top, named=False).ok
    assert not MutantVerdict(variant, top, top, named=False).ok
    mistake = Mutant("m", "part4", "kv_lab.py", (), diagnosis="d")
    assert MutantVerdict(mistake, top, top, named=True).ok  # the bonus lost: caught
