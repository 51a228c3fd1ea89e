"""Mutation testing of ``solution/`` with cosmic-ray, the grader as the test suite.

The mutant library (each part's ``grader/ta/mutants/<part>.toml``) is written by
the same hands as the checks, so it shares their blind spots. Here an established engine,
cosmic-ray, makes its own small edits (operators, comparisons, constants,
loops) inside the graded functions of each part, and each edit is graded
(public and hidden checks, without the timed benchmarks). An edit that keeps
full marks is a surviving mutant: a hole in the checks, or an edit that
changes nothing the handout asks for (an equivalent mutant), which the triage
file ``docs/mutation/triage.toml`` records with its reason.

The engine rewrites the files it mutates in place, so it only ever sees a
scratch copy of the solution (one per job, under ``results/mutation/``); the
checkout's ``solution/`` is never written. ``make mutation [PARTS=part1]
[JOBS=2]`` runs it; ``python -m grader.ta.mutation verdict DIR --part partN`` is
the test command the engine runs on a mutated copy (exit 0: full marks, the
mutant survived).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grader.core.paths import RESULTS, SOLUTION, SOLUTION_COPY_PATTERNS
from grader.core.registry import PARTS

WORKDIR = RESULTS / "mutation"

# The functions students write (those holding a solution region), per part and file
# ("Class.method" for methods), as each part declares them (``[ta.mutation_targets]`` of
# grader/parts/<tag>/part.toml). Left out: the plots (graded only as valid PNGs),
# constructors (they declare the layers, whose names and shapes loading the weights
# checks) and everything provided (helpers, the course harnesses, command-line code).
TARGETS: dict[str, dict[str, tuple[str, ...]]] = {
    tag: dict(part.ta.mutation_targets) for tag, part in PARTS.items()
}

# cosmic-ray's operators kept (regular expressions on its operator names). Every
# comparison, boolean, unary, constant, loop and exception operator, but of the
# 132 binary replacements only the arithmetic slips a person makes (+/-, */÷,
# / vs //, ** vs *): bitwise and shift replacements of arithmetic code are killed
# by any check and would multiply the run time. Decorator removal is left out
# (@torch.no_grad, @dataclass: no output changes); so are the variable operators,
# which need arguments.
OPERATORS = (
    r"core/ReplaceBinaryOperator_(Add_Sub|Add_Mul|Sub_Add|Mul_Add|Mul_Div|Div_Mul)$",
    r"core/ReplaceBinaryOperator_(Div_FloorDiv|FloorDiv_Div|Mod_FloorDiv|Pow_Mul)$",
    r"core/ReplaceComparisonOperator_(?!\w*_Is(Not)?$)\w+$",
    r"core/ReplaceComparisonOperator_(Is_IsNot|IsNot_Is)$",
    r"core/ReplaceUnaryOperator_(USub_UAdd|Delete_Not|Delete_USub)$",
    r"core/(AddNot|ReplaceTrueWithFalse|ReplaceFalseWithTrue|ReplaceAndWithOr|ReplaceOrWithAnd)$",
    r"core/(ReplaceBreakWithContinue|ReplaceContinueWithBreak|NumberReplacer)$",
    r"core/(ZeroIterationForLoop|ExceptionReplacer)$",
)

# Seconds one graded mutant may take, per part (``mutation_timeout_s``; a mutant that
# loops forever is killed by the grader's own limits well before; this only guards the
# engine's wait).
TIMEOUT_S = {tag: part.ta.mutation_timeout_s for tag, part in PARTS.items()}

_IGNORE = shutil.ignore_patterns(*SOLUTION_COPY_PATTERNS)


@dataclass(frozen=True)
class Mutant:
    """One engine mutation of a graded function and what grading it gave."""

    part: str
    file: str  # relative to the solution folder
    function: str  # qualified: "Class.method"
    operator: str
    line: int
    old: str  # the source line before the edit, stripped
    new: str  # the same line after it, stripped
    outcome: str  # "killed" | "survived" | "incompetent" | "no-test"
    output: str = ""  # the test command's output (which check killed it)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What a triage entry names: stable when unrelated lines move."""
        return (self.part, self.file, self.function, self.old, self.new)


def function_ranges(source: str, names: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """First and last line of each qualified function in ``names`` (a missing one raises)."""
    found: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                if name in names:
                    found[name] = (child.lineno, child.end_lineno or child.lineno)

    visit(ast.parse(source), "")
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"graded functions not found: {', '.join(missing)}")
    return found


def enclosing(ranges: dict[str, tuple[int, int]], line: int) -> str | None:
    """The innermost graded function holding ``line``, if any."""
    holders = [(end - start, n) for n, (start, end) in ranges.items() if start <= line <= end]
    return min(holders)[1] if holders else None


def operator_kept(name: str, patterns: tuple[str, ...] = OPERATORS) -> bool:
    return any(re.match(p, name) for p in patterns)


def verdict_command(copy: Path, part: str) -> str:
    """The engine's test command: grade the mutated copy's part without benchmarks."""
    parts = [sys.executable, "-m", "grader.ta.mutation", "verdict", str(copy), "--part", part]
    return shlex.join(parts)


def _config(files: list[str], test_command: str, timeout: float) -> str:
    modules = ", ".join(f'"{f}"' for f in files)
    return (
        "[cosmic-ray]\n"
        f"module-path = [{modules}]\n"
        f"timeout = {float(timeout)}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(test_command)}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
    )


def _engine(*args: str) -> list[str]:
    return [sys.executable, "-m", "cosmic_ray.cli", *args]


def prepare(
    part: str,
    workdir: Path,
    jobs: int,
    *,
    solution: Path = SOLUTION,
    targets: dict[str, tuple[str, ...]] | None = None,
    operators: tuple[str, ...] = OPERATORS,
    test_command=verdict_command,
) -> list[Path]:
    """One scratch copy of ``solution`` per job under ``workdir``, each with a cosmic-ray
    session holding its share of the graded functions' mutations; returns the shards."""
    solution, workdir = Path(solution).resolve(), Path(workdir).resolve()
    if workdir == solution or solution in workdir.parents or workdir in solution.parents:
        raise ValueError(f"the scratch folder {workdir} must lie outside {solution}")
    targets = targets if targets is not None else TARGETS[part]
    shards = []
    for k in range(jobs):
        shard = workdir / f"shard{k}"
        shutil.rmtree(shard, ignore_errors=True)
        copy = shard / "solution"
        shutil.copytree(solution, copy, ignore=_IGNORE)
        config = _config(list(targets), test_command(copy, part), TIMEOUT_S.get(part, 120))
        (shard / "cosmic-ray.toml").write_text(config)
        session = shard / "session.sqlite"
        subprocess.run(
            _engine("init", str(shard / "cosmic-ray.toml"), str(session)),
            cwd=copy,
            check=True,
            capture_output=True,
        )
        _select(session, copy, targets, operators, k, jobs)
        shards.append(shard)
    return shards


def _select(
    session: Path,
    copy: Path,
    targets: dict[str, tuple[str, ...]],
    operators: tuple[str, ...],
    k: int,
    jobs: int,
) -> None:
    """Keep in ``session`` only mutations inside graded functions, of kept operators, and
    of this shard (every ``jobs``-th in a fixed order)."""
    from cosmic_ray.work_db import WorkDB, use_db

    ranges = {f: function_ranges((copy / f).read_text(), names) for f, names in targets.items()}
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = []
        for item in db.work_items:
            (m,) = item.mutations
            file = str(m.module_path)
            if operator_kept(m.operator_name, operators) and enclosing(
                ranges[file], m.start_pos[0]
            ):
                items.append(item)
        items.sort(key=_order)
        db.clear()
        db.add_work_items(items[k::jobs])


def _order(item) -> tuple:
    """A fixed order of work items (the engine's own is random), so shards are stable."""
    (m,) = item.mutations
    return (str(m.module_path), tuple(m.start_pos), m.operator_name, m.occurrence)


def count(session: Path) -> int:
    """How many mutants a session holds."""
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(session), WorkDB.Mode.open) as db:
        return db.num_work_items


def execute(shards: list[Path], niceness: int = 10) -> None:
    """Run the engine on every shard at once (one process each), at lower priority."""
    procs = []
    for shard in shards:
        cmd = _engine("exec", str(shard / "cosmic-ray.toml"), str(shard / "session.sqlite"))
        if niceness:
            cmd = ["nice", "-n", str(niceness), *cmd]
        log = (shard / "engine.log").open("w")
        procs.append((subprocess.Popen(cmd, cwd=shard / "solution", stdout=log, stderr=log), log))
    failed = []
    for proc, log in procs:
        proc.wait()
        log.close()
        if proc.returncode:
            failed.append(proc.args)
    if failed:
        raise RuntimeError(f"cosmic-ray exec failed: {failed}")


def collect(part: str, shards: list[Path], targets: dict[str, tuple[str, ...]] | None = None):
    """Every mutant of the shards' sessions with its outcome, in source order."""
    from cosmic_ray.work_db import WorkDB, use_db

    targets = targets if targets is not None else TARGETS[part]
    mutants = []
    for shard in shards:
        copy = shard / "solution"
        sources = {f: (copy / f).read_text() for f in targets}
        ranges = {f: function_ranges(sources[f], names) for f, names in targets.items()}
        with use_db(str(shard / "session.sqlite"), WorkDB.Mode.open) as db:
            done = {item.job_id: result for item, result in db.completed_work_items}
            for item in db.work_items:
                (m,) = item.mutations
                file, line = str(m.module_path), m.start_pos[0]
                function = enclosing(ranges[file], line)
                if function is None:  # a session made before a function left the targets
                    continue
                result = done.get(item.job_id)
                old, new = _edit(sources[file], result.diff if result else "", line)
                if result is None:
                    outcome = "pending"
                elif result.test_outcome is None:
                    outcome = str(result.worker_outcome.value)
                else:
                    outcome = str(result.test_outcome.value)
                mutants.append(
                    Mutant(
                        part=part,
                        file=file,
                        function=function,
                        operator=m.operator_name,
                        line=line,
                        old=old,
                        new=new,
                        outcome=outcome,
                        output=(result.output or "")[-2000:] if result else "",
                    )
                )
    return sorted(mutants, key=lambda x: (x.file, x.line, x.operator, x.new))


def _edit(source: str, diff: str, line: int) -> tuple[str, str]:
    """The mutated line before and after, from the engine's unified diff."""
    lines = diff.splitlines()
    removed = [d[1:].strip() for d in lines if d.startswith("-") and not d.startswith("---")]
    added = [d[1:].strip() for d in lines if d.startswith("+") and not d.startswith("+++")]
    old = " ".join(removed) or source.splitlines()[line - 1].strip()
    return old, " ".join(added)


def verdict(copy: Path, part: str, checks: frozenset[str] | None = None) -> int:
    """Grade ``part`` of ``copy`` (public and hidden checks, no benchmarks; only the checks
    numbered in ``checks`` when given): 0 when every check passed (the mutant survived),
    1 naming the checks that failed (killed)."""
    from grader.grading.runner import grade

    with tempfile.TemporaryDirectory(prefix="mutation-verdict-") as tmp:
        results = grade(
            Path(copy),
            results_path=Path(tmp) / "results.json",
            parts=[part],
            skip_tags=frozenset({"benchmark"}),
            numbers=checks,
        )
    if results is None:
        print("grading crashed")
        return 2
    failed = [t.number for t in results.tests if t.status != "passed"]
    if not results.tests:
        print("no check ran")
        return 2
    print(f"failed: {' '.join(failed)}" if failed else "every check passed")
    return 1 if failed else 0


@contextlib.contextmanager
def exclusive(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock: a second run on the same scratch folders (which would
    delete the first one's copies under it) is refused instead."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another mutation run is using {folder}") from None
        yield


def run_part(part: str, jobs: int, workdir: Path = WORKDIR, niceness: int = 10):
    """Prepare, run and collect one part; returns (mutants, seconds)."""
    started = time.monotonic()
    with exclusive(workdir / part):
        shards = prepare(part, workdir / part, jobs)
        total = sum(count(s / "session.sqlite") for s in shards)
        print(f"{part}: {total} mutants in {jobs} shard(s)", flush=True)
        execute(shards, niceness)
        return collect(part, shards), time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    from grader import mutation_report as report

    parser = argparse.ArgumentParser(prog="python -m grader.ta.mutation", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verdict", help="grade a mutated copy (the engine's test command)")
    v.add_argument("copy", type=Path)
    v.add_argument("--part", required=True, choices=sorted(TARGETS))
    r = sub.add_parser("run", help="mutate, grade, report and check the triage")
    r.add_argument("--parts", default="", help="comma-separated (default: all four)")
    r.add_argument("--jobs", type=int, default=2, help="engine processes at once")
    r.add_argument("--nice", type=int, default=10, help="niceness of the engine and gradings")
    r.add_argument("--workdir", type=Path, default=WORKDIR)
    r.add_argument("--triage", type=Path, default=report.TRIAGE)
    c = sub.add_parser("count", help="how many mutants each part would grade")
    c.add_argument("--parts", default="")
    args = parser.parse_args(argv)
    if args.cmd == "verdict":
        return verdict(args.copy, args.part)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()] or list(TARGETS)
    if args.cmd == "count":
        with tempfile.TemporaryDirectory(prefix="mutation-count-") as tmp:
            for part in parts:
                shards = prepare(part, Path(tmp) / part, 1)
                print(f"{part}: {count(shards[0] / 'session.sqlite')} mutants")
        return 0
    runs = {}
    for part in parts:
        runs[part] = run_part(part, max(args.jobs, 1), args.workdir, args.nice)
    return report.finish(runs, args.triage, args.workdir)


if __name__ == "__main__":
    sys.exit(main())
