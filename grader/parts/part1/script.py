"""Part 1 graded from what a course-style script prints.

The course's Problem 1 asks for "a script (in any language of your choice)" that prints a
table of answers. A ``question1.py`` written that way defines none of the kit's functions
(``param_count``, ``max_batch_size``, ...), so nothing can be called: the grader runs it
once, as ``python question1.py`` (in the sandboxed worker, like any submission; the
adapter's ``run_script``), reads its answers by their labels
(:mod:`grader.parts.part1.printed`) and judges each case the course asked about as the
kit's checks do: the same expected values and known mistakes, through the seals in the
self-check and in plain form where the hidden file is at hand.

A printed number is rounded: "12.34 GiB" stands for every value that rounds to it. A value
printed finely enough (an integer in full, a float within the tolerance) is compared as
the kit compares a returned value. A coarser one is compared within its last digit where
the plain answers are at hand, and is right only if no known mistake rounds to it too.
The self-check holds only seals, which compare one value: there a coarse value is
reported as unchecked, with how to print it. Cases no script prints (a second model,
another input of its own, the hidden random specs) say which function to define to have
them graded. A file that defines any of the kit's functions is graded as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grader.judging.base import cause_sentence
from grader.parts.part1.causes import name_causes
from grader.parts.part1.printed import (
    DEFAULT_WHERE,
    Number,
    PrintedAnswers,
    Reading,
    read_answers,
)
from grader.parts.part1.seal import Verdict
from grader.runtime.outcomes import SubmissionError

GIB = 2**30
#: Characters of a script's output read at most (the worker keeps no more either).
MAX_OUTPUT = 64_000
#: The write-up's model: LLaMA-3-8B in fp16, untied, on 80 GiB GPUs at context 1024.
WRITE_UP_SPEC = dict(
    n_layers=32, n_q_heads=32, n_kv_heads=8, d_model=4096, d_ff=14336, vocab_size=128256
)
#: Each function's parameters in order, with the defaults the handout gives them.
PARAMETERS = {
    "param_count": ("spec",),
    "weight_bytes": ("spec",),
    "kv_cache_bytes_per_request": ("spec", "context_len", "bytes_per_elem"),
    "max_batch_size": ("spec", "gpu_mem_bytes", "context_len", "tp"),
    "attention_flops": ("N", "d", "phase"),
    "attention_bytes": ("N", "d", "phase", "bpe"),
    "arithmetic_intensity": ("N", "d", "phase", "bpe", "batch"),
    "answer_table": ("spec", "gpu_mem_gib", "context_len", "tp", "head_dim"),
}
DEFAULTS = {"bytes_per_elem": 2, "tp": 1, "bpe": 2, "batch": 1}
#: The signature to define, named in feedback, as the handout writes it.
SIGNATURES = {
    "param_count": "param_count(spec)",
    "weight_bytes": "weight_bytes(spec)",
    "kv_cache_bytes_per_request": "kv_cache_bytes_per_request(spec, context_len, bytes_per_elem=2)",
    "max_batch_size": "max_batch_size(spec, gpu_mem_bytes, context_len, tp=1)",
    "attention_flops": "attention_flops(N, d, phase)",
    "attention_bytes": "attention_bytes(N, d, phase, bpe=2)",
    "arithmetic_intensity": "arithmetic_intensity(N, d, phase, bpe=2, batch=1)",
    "answer_table": "answer_table()",
}
#: What each printed answer is, in feedback, and a label the grader reads as it.
DESCRIPTIONS = {
    "params": ("the total parameter count", "Total model parameters: … (every digit)"),
    "weight_bytes": ("the weight memory", "Weight memory: … GiB"),
    "kv_bytes": ("the KV cache per request", "KV cache per request: … GiB"),
    "max_batch": ("the max batch size", "Max batch size (TP = {tp}): …"),
    "ai": ("the arithmetic intensity", "Arithmetic intensity ({phase}): … FLOPs/byte"),
    "flops": ("the attention FLOPs", "{Phase} attention FLOPs: …"),
    "bytes": ("the attention bytes", "{Phase} attention bytes: …"),
}
#: ``answer_table``'s entries: the printed answer each is read from, and its scale.
TABLE = {
    "total_params": ("params", {}, 1.0),
    "total_params_billion": ("params", {}, 1e-9),
    "weight_gib": ("weight_bytes", {}, 1 / GIB),
    "kv_cache_per_request_gib": ("kv_bytes", {}, 1 / GIB),
    "max_batch_size": ("max_batch", {"tp": 1}, 1.0),
    "max_batch_size_tp": ("max_batch", {"tp": 2}, 1.0),
    "ai_prefill": ("ai_prefill", {"N": 1024, "d": 128, "batch": 1}, 1.0),
    "ai_decode": ("ai_decode", {"N": 1024, "d": 128, "batch": 1}, 1.0),
}


@dataclass
class ScriptRun:
    """A script's run: what it printed, read, and how the run ended."""

    answers: PrintedAnswers = field(default_factory=PrintedAnswers)
    error: str = ""  # how the run failed ("" if it ended normally)


def script_run(ctx: Any, part: str) -> ScriptRun | None:
    """The submission run as a script, once per grading (kept in ``ctx.scratch``); None
    when it defines any of the kit's functions (the grader calls those)."""
    key = f"{part}.script"
    if key not in ctx.scratch:
        ctx.scratch[key] = _run(ctx, part)
    return ctx.scratch[key]


def _run(ctx: Any, part: str) -> ScriptRun | None:
    try:
        reply = ctx.worker(part).request({"op": "run_script"}, what="python question1.py")
    except SubmissionError as exc:
        return ScriptRun(error=exc.message)
    header = reply.header
    defined = header.get("defined")
    if not isinstance(defined, list) or defined:
        return None
    stdout = header.get("stdout")
    stdout = stdout[:MAX_OUTPUT] if isinstance(stdout, str) else ""
    error = header.get("error")
    said = ""
    if isinstance(error, dict):
        said = f"it raised {str(error.get('type'))[:80]}: {str(error.get('message'))[:300]}"
    return ScriptRun(answers=read_answers(stdout), error=said)


# --------------------------------------------------------------------------- targets


def _write_up_spec(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("__spec__"), dict):
        return False
    fields = dict(value["__spec__"])
    extra = {"bytes_per_param": 2, "tied_embeddings": False}
    return all(fields.pop(k, v) == v for k, v in extra.items()) and fields == WRITE_UP_SPEC


def target(case: dict[str, Any]) -> tuple[str, dict[str, int]] | str | None:
    """What a script prints for ``case``: (answer key, inputs), "table" for the answer
    table, or None when the case asks for inputs the course's script does not print."""
    func = case["func"]
    names = PARAMETERS.get(func)
    if names is None or len(case["args"]) > len(names):
        return None
    bound = {**DEFAULTS, **dict(zip(names, case["args"], strict=False)), **case["kwargs"]}
    if func == "answer_table":
        return "table" if not case["args"] and not case["kwargs"] else None
    if "spec" in names:
        if not _write_up_spec(bound.get("spec")):
            return None
        if func in ("param_count", "weight_bytes"):
            return ("params" if func == "param_count" else "weight_bytes"), {}
        if bound.get("context_len") != 1024:
            return None
        if func == "kv_cache_bytes_per_request":
            return ("kv_bytes", {}) if bound["bytes_per_elem"] == 2 else None
        return ("max_batch", {"tp": bound["tp"]}) if bound["gpu_mem_bytes"] == 80 * GIB else None
    if bound["bpe"] != 2 or bound.get("phase") not in ("prefill", "decode"):
        return None
    kind = {"attention_flops": "flops", "attention_bytes": "bytes"}.get(func, "ai")
    where = {"N": bound["N"], "d": bound["d"]}
    if kind == "ai":
        where["batch"] = bound["batch"]
    return f"{kind}_{bound['phase']}", where


def asked_by_course(goal: tuple[str, dict[str, int]] | str) -> bool:
    """Whether the course's Problem 1 asks a script for this answer: the write-up's
    tensor-parallel degree is X = 2, so a batch size under TP 4 or 8 is graded when the
    script prints it and left out of its check's count when it does not."""
    return not (isinstance(goal, tuple) and goal[1].get("tp", 1) not in (1, 2))


def _base(key: str) -> str:
    return key.rsplit("_", 1)[0] if key.endswith(("_prefill", "_decode")) else key


def _one(answers: PrintedAnswers, key: str, where: dict[str, int]) -> Any:
    """The single reading of ``key`` at ``where``, or a sentence saying why there is none."""
    at = {**{k: DEFAULT_WHERE[k] for k in where}, **where}
    found = answers.find(key, at)
    bad = [r for r in found if not hasattr(r, "options")]
    if bad:
        return f"the line {bad[0].line[:200]!r} cannot be read unambiguously ({bad[0].why})"
    if not found:
        desc, example = DESCRIPTIONS[_base(key)]
        phase = key.rsplit("_", 1)[-1]
        example = example.format(tp=where.get("tp", 1), phase=phase, Phase=phase.capitalize())
        return f"no line of its output reads as {desc} (a line such as {example!r})"
    if key == "params":
        return _with_exact_count(answers, found[0])
    return found[0]


def _with_exact_count(answers: PrintedAnswers, params: Any) -> Any:
    """A rounded parameter count made exact by the weight bytes printed beside it, as a
    TA reads "1.23 Billion" next to "Memory in bytes: ...": the bytes over the write-up's
    2 bytes per parameter, where that rounds to the printed count."""
    weights = answers.find("weight_bytes", {})
    exact = [r.options[0].exact_int() for r in weights if hasattr(r, "options")]
    count = exact[0] // 2 if exact and exact[0] is not None and exact[0] % 2 == 0 else None
    if count is None or params.options[0].exact_int() is not None:
        return params
    if not params.options[0].contains(count, 0.0):
        return params
    number = Number(float(count), 1.0, params.options[0].text)
    return Reading(params.key, params.where, (number,), params.line)


# --------------------------------------------------------------------------- judging


@dataclass
class Judgement:
    """One reading of a printed answer against a case: "right", "coarse" (it rounds to the
    right value and to a known mistake's), "unchecked" (too coarse for the seals), or
    "wrong", with the wrong entries and the known mistakes it matches."""

    status: str
    wrong: list[str] = field(default_factory=list)
    mistakes: list[str] = field(default_factory=list)
    coarse: list[str] = field(default_factory=list)

    def rank(self) -> int:
        order = ("right", "coarse", "unchecked")
        if self.status in order:
            return order.index(self.status)
        return 3 if self.mistakes else 4


def _plain(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {"": value}


def judge(numbers: dict[str, Number], verdict: Verdict) -> Judgement:
    """Printed ``numbers`` (by table entry; ``""`` for a single value) against a case.
    Values printed finely enough are compared exactly as the kit compares returned ones;
    coarser ones within their last digit, where the plain answers are at hand."""
    kinds = verdict.kinds()
    kind_of = kinds if isinstance(kinds, dict) else {"": kinds}
    rel_tol = verdict.rel_tol
    coarse = [k for k, kind in kind_of.items() if not numbers[k].precise(kind, rel_tol)]
    if not coarse:
        got = {
            k: numbers[k].exact_int() if kind == "int" else float(numbers[k].value)
            for k, kind in kind_of.items()
        }
        value = got if isinstance(kinds, dict) else got[""]
        if verdict.right(value):
            return Judgement("right")
        wrong = verdict.wrong_entries(got) if isinstance(kinds, dict) else [""]
        return Judgement("wrong", wrong, verdict.mistakes(value))
    if verdict.answer is None:
        return Judgement("unchecked", coarse=coarse)
    expected = _plain(verdict.answer["expected"])
    mistakes = {n: _plain(v) for n, v in verdict.answer.get("mistakes", {}).items()}
    wrong = [k for k in kind_of if not numbers[k].contains(expected[k], rel_tol)]
    alike = [
        name
        for name, value in mistakes.items()
        if value.keys() == kind_of.keys()
        and all(numbers[k].contains(value[k], rel_tol) for k in kind_of)
    ]
    if not wrong:
        return Judgement("coarse" if alike else "right", mistakes=alike, coarse=coarse)
    return Judgement("wrong", wrong, alike, coarse)


def _readings(answers: PrintedAnswers, goal: Any) -> tuple[dict[str, Any], str]:
    """The readings a case is judged from, by table entry (``""`` for one value), or a
    sentence saying what is missing or unreadable."""
    if goal != "table":
        found = _one(answers, *goal)
        return ({"": (found, 1.0)}, "") if not isinstance(found, str) else ({}, found)
    out, problems = {}, []
    for entry, (key, where, scale) in TABLE.items():
        found = _one(answers, key, where)
        if isinstance(found, str):
            problems.append(found)
        else:
            out[entry] = (found, scale)
    return out, "; ".join(dict.fromkeys(problems))


def best_judgement(readings: dict[str, Any], verdict: Verdict) -> Judgement:
    """The most favourable reading of "GB" (2^30 bytes, as the course writes it, or 10^9),
    taken alike for every entry."""
    judgements = []
    for i in (0, 1):
        numbers = {
            k: r.options[min(i, len(r.options) - 1)].scaled(scale)
            for k, (r, scale) in readings.items()
        }
        judgements.append(judge(numbers, verdict))
    return min(judgements, key=Judgement.rank)


# -------------------------------------------------------------------------- feedback

#: The failure kind of a case a script cannot answer (inputs the course did not ask about):
#: left out of the check's count, as the course's TA would, where the script answered others.
NOT_ASKED = "not_asked"

SCRIPT_NOTE = (
    "question1.py defines none of the functions the grader calls, so it was run as a script "
    "(python question1.py) and graded from what it printed"
)


def _define(case: dict[str, Any]) -> str:
    signature = SIGNATURES.get(case["func"], case["func"])
    return f"define `{signature}` in question1.py (as the handout writes it) for the grader to call"


def _shown(readings: dict[str, Any], entries: list[str]) -> str:
    """The student's own lines for ``entries`` (never the expected values)."""
    lines = [readings[k][0].line for k in entries if k in readings]
    return "; ".join(f"`{line[:160]}`" for line in dict.fromkeys(lines))


def _message(what: str, case: dict[str, Any], readings: dict, j: Judgement, diagnoses: dict) -> str:
    """Feedback for a printed answer that did not pass."""
    if j.status == "coarse":
        return (
            f"{what}: your script printed {_shown(readings, j.coarse)}, too few digits to be "
            "graded: a known mistake's value rounds to the same figure. Print every digit "
            "of an integer and 7 significant digits of other values."
        )
    if j.status == "unchecked":
        return (
            f"{what}: your script printed {_shown(readings, j.coarse)}. The self-check "
            "compares with sealed answers and can check a printed value only in full "
            "(every digit of an integer, 7 significant digits of other values); Gradescope "
            "grades it within its last printed digit. Print more digits to check it here."
        )
    compared = "exactly" if verdict_kind(case) == "int" else "within the tolerance"
    if "" in readings:
        text = f"{what}: your script printed {_shown(readings, [''])}, which is wrong"
    else:
        right = len(readings) - len(j.wrong)
        text = (
            f"{what}, read from your script's output: wrong entries: "
            f"{', '.join(j.wrong)} (from {_shown(readings, j.wrong)}); the other {right} "
            "entries are right"
        )
    if j.coarse:
        compared += " or within its last printed digit"
    cause = cause_sentence(name_causes(j.mistakes, diagnoses))
    return f"{text} (compared {compared}). {cause}".strip()


def verdict_kind(case: dict[str, Any]) -> str:
    return "int" if case.get("want") == "int" else "float"


def grade_case(
    run: ScriptRun, case: dict[str, Any], verdict: Verdict, diagnoses: dict[str, str]
) -> tuple[bool, str, str]:
    """One case of a script-only submission, judged from what it printed:
    (passed, message, kind of failure)."""
    what = f"{case['func']}({case['label']})"
    goal = target(case)
    if goal is None:
        return (
            False,
            (
                f"{what} cannot be graded from what a script prints: its inputs are not "
                f"the write-up's, and only a call answers them. To have it graded, "
                f"{_define(case)}."
            ),
            NOT_ASKED,
        )
    readings, problem = _readings(run.answers, goal)
    if problem and not asked_by_course(goal):
        return (
            False,
            f"{what} is not printed: {problem}. To have it graded, {_define(case)}.",
            NOT_ASKED,
        )
    if problem:
        ended = f" The run ended badly: {run.error}." if run.error else ""
        return (
            False,
            f"{what}: {SCRIPT_NOTE}, but {problem}.{ended} Print it so, or {_define(case)}.",
            "script",
        )
    j = best_judgement(readings, verdict)
    if j.status == "right":
        return True, "", ""
    return False, _message(what, case, readings, j, diagnoses), "value"
