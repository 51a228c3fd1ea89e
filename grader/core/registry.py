"""The assignment's parts: what file each needs and which checks grade it.

Each part is one folder, ``grader/parts/<tag>/``:

- ``checks.py`` (with ``support.py``, ``timed.py``, ``diagnosis.py`` where the part needs
  them): the part's checks, trusted, run in the grader;
- ``cases.py``: the constants and seeded data both the checks and the builder use;
- ``build.py`` (and ``build_*.py``): builds the part's test cases and diagnosis catalogue
  from ``solution/`` (``python -m grader regen``); TA-side only, never in the autograder zip;
- ``adapter.py`` (and ``adapter_*.py`` beside it): the worker side, the only files that
  touch student code. They are copied into each sandbox as ``adapter_<tag>.py`` (and
  ``adapter_<tag>_*.py``) and import nothing of the grader;
- ``mutants.toml``: the part's mutant library (known mistakes and correct variants).

A part may hold more modules of its own (Part 1's ``seal.py``: the write-up answers sealed
in the public cases students get).

The shared machinery sits beside them: ``grader/checks`` (base classes, logit
comparison, timed pools), ``grader/worker`` (the worker's main loop, protocol and
value encoding), the client, sandbox, timing and results modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True)
class Part:
    tag: str  # "part1" ... "part4": the tag on every check of the part
    title: str
    main_file: str  # the file the submission must contain, relative to its folder
    checks_module: str  # module holding the part's unittest.TestCase classes
    # What its adapter imports before the student's code (``module`` or
    # ``module:name,...``), loaded once by a fork server that starts its workers. Each
    # part's list holds the one before it, so that one server grows with the grading
    # (numpy, then torch, then transformers: ``ForkServer.extend``).
    preload: tuple[str, ...] = ()
    # Whether that server may import the next part's libraries while this part's workers
    # run (``ForkServer.import_ahead``): true where they are small, so the next part finds
    # its libraries imported instead of waiting for them; false where the server's growth
    # would add to the grading's peak memory, which Part 3's workers set.
    import_next_beside: bool = False
    # What a class regrade's shared server imports as well, once for every grading it
    # serves: libraries the part's workers import themselves (Part 1's plots), worth
    # importing once for a class but not in one grading's memory (matplotlib: 31 MiB).
    class_preload: tuple[str, ...] = ()
    # The files a student edits besides ``main_file`` (each must be uploaded), and the
    # assignment's files they need not edit: the kit supplies those an upload lacks.
    also_edited: tuple[str, ...] = ()
    given: tuple[str, ...] = ()
    # Whether ``main_file`` may come as a Jupyter notebook of the same name (the course's
    # lab handout accepts one): graded as the script it defines (grader/sandbox/notebook.py).
    notebook: bool = False

    @property
    def edited(self) -> tuple[str, ...]:
        """Every file of the part a student must upload, ``main_file`` first."""
        return (self.main_file, *self.also_edited)


PARTS: dict[str, Part] = {
    "part1": Part(
        "part1",
        "KV-cache calculator",
        "question1.py",
        "grader.parts.part1.checks",
        preload=("numpy",),
        import_next_beside=True,
        class_preload=("matplotlib.pyplot",),
    ),
    "part2": Part(
        "part2",
        "Tiny transformer with a KV cache",
        "transformer_skeleton.py",
        "grader.parts.part2.checks",
        preload=("numpy", "torch"),
    ),
    "part3": Part(
        "part3",
        "KV caching in Llama 3",
        "llama/model.py",
        "grader.parts.part3.checks",
        preload=("numpy", "torch"),
        also_edited=("llama/generation.py",),
        given=("llama/__init__.py", "llama/tokenizer.py", "inference.py", "benchmark_inference.py"),
    ),
    "part4": Part(
        "part4",
        "KV-cache lab (distilgpt2 shape)",
        "kv_lab.py",
        "grader.parts.part4.checks",
        preload=("numpy", "torch", "transformers:GPT2Config,GPT2LMHeadModel,DynamicCache"),
        notebook=True,
    ),
}


def imports_ahead(graded: list[str]) -> dict[str, tuple[str, ...]]:
    """Per part of ``graded`` (the parts whose workers a grading starts, in order), the
    libraries its fork server imports ahead once the part's first worker is forked: the
    next part's, where the part allows it (``import_next_beside``)."""
    return {
        part: PARTS[after].preload
        for part, after in pairwise(graded)
        if PARTS[part].import_next_beside and PARTS[after].preload
    }


def parse_parts(spec: str | None) -> list[str]:
    """``"part1,part2"`` -> ``["part1", "part2"]``; ``None`` or ``""`` means every part."""
    if not spec:
        return list(PARTS)
    tags = [t.strip() for t in spec.split(",") if t.strip()]
    unknown = [t for t in tags if t not in PARTS]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; available: {', '.join(PARTS)}")
    return tags
