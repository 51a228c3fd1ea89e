"""``make mutation``'s driver, cheaply: cosmic-ray on a tiny function, the verdict on one
Part 1 mutant, and the committed triage file against the solution's source."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from grader.ta import mutation
from grader.ta import mutation_report as report

# One pytest-xdist worker runs this module: its module fixtures are built once.
pytestmark = pytest.mark.xdist_group("mutation")

ROOT = Path(__file__).resolve().parents[2]

TINY = """\
def add(a, b):
    return a + b * 1


def untouched(a):
    return a - 1
"""


def tiny_test(copy: Path, part: str) -> str:
    """The tiny module's "test suite": one assertion, run in the mutated copy."""
    return shlex.join([sys.executable, "-c", "import tiny; assert tiny.add(2, 3) == 5"])


def test_graded_functions_are_found_by_qualified_name() -> None:
    source = "class A:\n    def f(self):\n        return 1\n\n\ndef f():\n    return 2\n"
    ranges = mutation.function_ranges(source, ("A.f", "f"))
    assert ranges == {"A.f": (2, 3), "f": (6, 7)}
    assert mutation.enclosing(ranges, 3) == "A.f"
    assert mutation.enclosing(ranges, 4) is None
    with pytest.raises(ValueError, match=r"B\.g"):
        mutation.function_ranges(source, ("B.g",))


def test_every_graded_function_is_one_students_write() -> None:
    """Each target exists in solution/ and holds a solution region (not provided code)."""
    for files in mutation.TARGETS.values():
        for file, names in files.items():
            source = (ROOT / "solution" / file).read_text()
            lines = source.splitlines()
            for name, (start, end) in mutation.function_ranges(source, names).items():
                body = "\n".join(lines[start - 1 : end])
                assert "# BEGIN SOLUTION" in body, f"{file}:{name} is provided code"


def test_operator_selection_keeps_the_slips_a_person_makes() -> None:
    keep = mutation.operator_kept
    assert keep("core/ReplaceBinaryOperator_Add_Sub")
    assert keep("core/ReplaceBinaryOperator_Div_FloorDiv")
    assert not keep("core/ReplaceBinaryOperator_Add_BitOr")
    assert keep("core/ReplaceComparisonOperator_Lt_LtE")
    assert not keep("core/ReplaceComparisonOperator_Lt_Is")
    assert keep("core/ReplaceComparisonOperator_Is_IsNot")
    assert keep("core/NumberReplacer")
    assert not keep("core/RemoveDecorator")


def test_the_scratch_folder_may_not_be_the_solution(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    for inside in (tmp_path, tmp_path / "scratch"):
        with pytest.raises(ValueError, match="outside"):
            mutation.prepare("tiny", inside, 1, solution=tmp_path, targets={"tiny.py": ("add",)})


def test_a_second_run_on_the_same_scratch_folder_is_refused(tmp_path: Path) -> None:
    refused = pytest.raises(RuntimeError, match="another mutation run")
    with mutation.exclusive(tmp_path), refused, mutation.exclusive(tmp_path):
        pass
    with mutation.exclusive(tmp_path):  # released once the first run ends
        pass


@pytest.fixture(scope="session")  # once per worker, however its tests interleave
def tiny_run(tmp_path_factory: pytest.TempPathFactory):
    """cosmic-ray run for real over ``add`` in two shards; the source folder kept intact."""
    base = tmp_path_factory.mktemp("mutation")
    solution = base / "solution"
    solution.mkdir()
    (solution / "tiny.py").write_text(TINY)
    targets = {"tiny.py": ("add",)}
    shards = mutation.prepare(
        "tiny", base / "work", 2, solution=solution, targets=targets, test_command=tiny_test
    )
    mutation.execute(shards, niceness=0)
    return solution, shards, mutation.collect("tiny", shards, targets)


def test_the_engine_grades_only_the_graded_function_and_never_the_source(tiny_run) -> None:
    solution, shards, mutants = tiny_run
    assert (solution / "tiny.py").read_text() == TINY
    assert sorted(p.name for p in solution.iterdir()) == ["tiny.py"]
    assert mutants and {m.function for m in mutants} == {"add"}
    assert all(m.old == "return a + b * 1" for m in mutants)
    # Two shards, each a disjoint share of the work.
    shares = [mutation.count(s / "session.sqlite") for s in shards]
    assert all(shares) and sum(shares) == len(mutants) == len({m.new for m in mutants})
    for shard in shards:  # each shard's copy is restored after its mutations
        assert (shard / "solution" / "tiny.py").read_text() == TINY


def test_killed_mutants_count_killed_and_survivors_are_listed(tiny_run) -> None:
    _, _, mutants = tiny_run
    outcome = {m.new: m.outcome for m in mutants}
    assert outcome["return a - b * 1"] == "killed"
    assert outcome["return a + b + 1"] == "killed"
    # b / 1 == b: 2 + 3.0 == 5, the one survivor.
    assert outcome["return a + b / 1"] == "survived"
    assert [m.new for m in mutants if m.outcome == "survived"] == ["return a + b / 1"]
    s = report.score("tiny", mutants, [], 1.0)
    assert (s.killed, s.survived, s.equivalent) == (len(mutants) - 1, 1, 0)
    assert s.score == pytest.approx((len(mutants) - 1) / len(mutants))
    text = report.render([s], mutants, [], [])
    assert "`return a + b * 1` -> `return a + b / 1` (NOT TRIAGED)" in text


def _entry(new: str, status: str = "equivalent", **kw) -> report.Entry:
    fields = {"reason": "b / 1 is b"} if status == "equivalent" else {"check": "9.9"}
    return report.Entry(
        "tiny", "tiny.py", "add", "return a + b * 1", new, status, **{**fields, **kw}
    )


def test_the_triage_is_checked_against_the_engines_survivors(tiny_run) -> None:
    _, _, mutants = tiny_run
    survivor = _entry("return a + b / 1")
    assert report.triage_problems(mutants, [survivor], ["tiny"]) == []
    assert report.score("tiny", mutants, [survivor], 1.0).score == 1.0
    [missing] = report.triage_problems(mutants, [], ["tiny"])
    assert missing.startswith("untriaged survivor") and "a + b / 1" in missing
    stale = _entry("return a - b * 1")  # killed by the test: an equivalent entry is stale
    [problem] = report.triage_problems(mutants, [survivor, stale], ["tiny"])
    assert problem.startswith("stale equivalent entry (no longer survives)")
    hole = _entry("return a + b / 1", status="open", reason="a hole, not closed yet")
    assert report.triage_problems(mutants, [hole], ["tiny"]) == []
    assert report.score("tiny", mutants, [hole], 1.0).score < 1.0
    claimed = _entry("return a + b / 1", status="killed")
    [problem] = report.triage_problems(mutants, [claimed], ["tiny"])
    assert problem.startswith("marked killed by 9.9 but survives")
    # Entries of a part that did not run are not judged.
    elsewhere = report.Entry("part1", "q.py", "f", "a", "b", "equivalent", "another part")
    assert report.triage_problems(mutants, [survivor, elsewhere], ["tiny"]) == []


TRIAGE_HEAD = '[[survivor]]\npart = "part1"\nfile = "q.py"\nfunction = "f"\nold = "a"\nnew = "b"\n'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (TRIAGE_HEAD + 'status = "equivalent"\n', "needs a reason"),
        (TRIAGE_HEAD + 'status = "killed"\n', "names the check"),
        (TRIAGE_HEAD + 'status = "open"\n', "open mutant needs a reason"),
        (TRIAGE_HEAD + 'status = "maybe"\nreason = "x"\n', "status"),
        ((TRIAGE_HEAD + 'status = "equivalent"\nreason = "x"\n') * 2, "repeats"),
    ],
)
def test_a_malformed_triage_file_is_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "triage.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        report.load_triage(path)


def test_the_verdict_grades_a_copy_of_part1(tmp_path: Path) -> None:
    copy = tmp_path / "solution"
    shutil.copytree(ROOT / "solution", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert mutation.verdict(copy, "part1") == 0
    q1 = copy / "question1.py"
    q1.write_text(q1.read_text().replace("ffn = 3 * d * spec.d_ff", "ffn = 2 * d * spec.d_ff"))
    assert mutation.verdict(copy, "part1") == 1


def test_the_committed_triage_names_lines_of_the_graded_functions() -> None:
    """Every entry's mutated line is still in its function of solution/ (else the
    triage is stale against the source, whatever a run would say)."""
    entries = report.load_triage(report.TRIAGE)
    assert entries, "docs/mutation/triage.toml holds no entry"
    for e in entries:
        names = mutation.TARGETS[e.part][e.file]
        assert e.function in names, e
        source = (ROOT / "solution" / e.file).read_text()
        start, end = mutation.function_ranges(source, names)[e.function]
        body = [line.strip() for line in source.splitlines()[start - 1 : end]]
        assert e.old in body or e.old in " ".join(body), (
            f"{e.function}: `{e.old}` is no longer in solution/{e.file}"
        )


KILLED = [e for e in report.load_triage(report.TRIAGE) if e.status == "killed"]


def test_the_triage_holds_killed_entries_that_name_their_checks() -> None:
    assert KILLED
    assert all(e.check_numbers for e in KILLED), [e.check for e in KILLED if not e.check_numbers]


@pytest.mark.mutants
@pytest.mark.parametrize("entry", KILLED, ids=lambda e: f"{e.part}-{e.function}-{e.new[:40]}")
def test_every_survivor_triaged_as_killed_loses_points(tmp_path: Path, entry) -> None:
    """The check named by each "killed" entry really catches it: the mutated line put back
    into a copy of the solution fails that check (graded alone, without the benchmarks)."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "solution", copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / entry.file
    lines = path.read_text().splitlines(keepends=True)
    names = mutation.TARGETS[entry.part][entry.file]
    start, end = mutation.function_ranges("".join(lines), names)[entry.function]
    [i] = [i for i in range(start - 1, end) if lines[i].strip() == entry.old]
    lines[i] = lines[i].replace(entry.old, entry.new)
    path.write_text("".join(lines))
    assert mutation.verdict(copy, entry.part, checks=entry.check_numbers) == 1, entry
