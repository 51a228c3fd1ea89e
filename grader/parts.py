"""The assignment's parts: what file each needs and which checks grade it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    tag: str  # "part1" ... "part4": the tag on every check of the part
    title: str
    main_file: str  # the file the submission must contain, relative to its folder
    checks_module: str  # module holding the part's unittest.TestCase classes


PARTS: dict[str, Part] = {
    "part1": Part("part1", "KV-cache calculator", "question1.py", "grader.checks.part1"),
    "part2": Part(
        "part2",
        "Tiny transformer with a KV cache",
        "transformer_skeleton.py",
        "grader.checks.part2",
    ),
    "part3": Part("part3", "KV caching in Llama 3", "llama/model.py", "grader.checks.part3"),
    "part4": Part("part4", "KV-cache lab (distilgpt2 shape)", "kv_lab.py", "grader.checks.part4"),
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
