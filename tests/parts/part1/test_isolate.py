"""Part 1 diagnosis by isolation: mistakes the mutant library does not hold are named by
the argument they ignore or by what the wrong value is in the spec's own quantities, and
a known mistake that gives the same value for another reason is no longer named.

Each grading test edits a copy of the reference the way a student might have written the
mistake; none of these edits is in ``grader/ta/mutants/part1.toml`` (checked below)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from grader.parts.part1.build import call, hidden_cases, public_cases
from grader.parts.part1.isolate import experiments, read_experiment, value_findings
from grader.parts.part1.knock_on import Call
from grader.ta.mutants import load_mutants
from tests.conftest import SOLUTION, grade_checks

MUTANTS = load_mutants("part1", combined=False)
DIAGNOSES = {m.name: m.diagnosis for m in MUTANTS}
SOURCE = (SOLUTION / "question1.py").read_text()

KV_RETURN = "return per_token_per_layer * spec.n_layers * context_len * bytes_per_elem"
BATCH_RETURN = "return max(free // per_request, 0)"
FREE = "free = tp * gpu_mem_bytes - weight_bytes(spec)"
DECODE_FLOPS = "return float(4 * N * d)  #"
PREFILL_FLOPS = "return float(4 * N * N * d)"
PREFILL_BYTES = "return float((4 * N * N + 4 * N * d) * bpe)"
DECODE_BYTES = "return float((2 * d + 2 * N * d + 4 * N) * bpe)"


def module_of(source: str, name: str) -> ModuleType:
    import sys

    module = ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    try:
        exec(compile(source, name, "exec"), module.__dict__)
    finally:
        sys.modules.pop(name, None)
    return module


def value(module: ModuleType, c: Call) -> float:
    return call(module, {"func": c.func, "args": list(c.args), "kwargs": dict(c.kwargs)})


def every_call() -> list[Call]:
    calls = [Call.of(c) for c in public_cases() + hidden_cases() if c["func"] != "answer_table"]
    return list({c.key(): c for c in calls}.values())


# ------------------------------------------------------------------- the experiments

SPEC = {"__spec__": {"n_layers": 4, "n_q_heads": 8, "n_kv_heads": 2, "d_model": 512,
                     "d_ff": 1024, "vocab_size": 1000}}  # fmt: skip


def test_each_experiment_states_how_the_reference_responds() -> None:
    """The handout's closed forms the experiments rely on hold for the reference: a stated
    ratio is the reference's, and "the right value grows" is true on every case's input."""
    reference = module_of(SOURCE, "_reference")
    checked = 0
    for c in every_call():
        for exp in experiments(c):
            before, after = value(reference, exp.base or c), value(reference, exp.call)
            if exp.ratio is None:
                assert after > before, (c, exp)
            else:
                assert after == pytest.approx(before * exp.ratio, rel=1e-12), (c, exp)
            checked += 1
    assert checked > 50


def test_no_known_mistake_ignores_an_argument() -> None:
    """Why an ignored argument is decisive: every mistake of the library still moves with
    each argument the experiments vary, so a value that does not is none of them."""
    for mutant in MUTANTS:
        source = SOURCE
        for old, new in mutant.edits:
            source = source.replace(old, new)
        module = module_of(source, f"_mutant_{mutant.name}")
        for c in every_call():
            for exp in experiments(c):
                before, after = value(module, exp.base or c), value(module, exp.call)
                found = read_experiment(c, exp, before, after, 1e-6)
                assert before == 0 or found is None or not found.decisive, (mutant.name, exp)


def test_the_edits_below_are_not_in_the_mutant_library() -> None:
    news = {new for m in MUTANTS for _, new in m.edits}
    for edit in EDITS.values():
        assert all(new not in news for _, new in edit)


def test_a_wrong_value_is_explained_in_the_specs_quantities() -> None:
    """Without any experiment: a count short by d_model, bytes short by one N x d matrix,
    and a value a factor n_layers too small, each against the right value alone."""
    spec = {"__spec__": dict(SPEC["__spec__"])}
    right = 123_456_789

    def ids(c: Call, got: float) -> list[str]:
        return [f.cause.id for f in value_findings(c, got, lambda v: v == right)]

    assert ids(Call("param_count", (spec,)), right - 512) == ["isolated:short_by_d_model"]
    assert ids(Call("param_count", (spec,)), right + 1000 * 512) == [
        "isolated:over_by_vocab_d_model"
    ]
    assert ids(Call("attention_bytes", (64, 16, "prefill", 2)), right - 64 * 16 * 2) == [
        "isolated:short_by_n_d"
    ]
    kv = Call("kv_cache_bytes_per_request", (spec, 100, 3))
    assert ids(kv, right + 1) == []  # nothing in the spec's quantities: nothing said
    # n_layers and n_q_heads / n_kv_heads are both 4: the value cannot tell them apart
    assert ids(kv, right / 4) == ["isolated:factor_n_layers_or_gqa_ratio"]
    spec["__spec__"]["n_layers"] = 6
    assert ids(kv, right / 6) == ["isolated:factor_n_layers"]


def test_a_rounded_batch_is_decisive_only_when_floored_it_is_right() -> None:
    c = Call("max_batch_size", (SPEC, 0, 0))
    found = value_findings(c, 8, lambda v: v == 7, quotient=7.6)
    assert [(f.cause.id, f.decisive) for f in found] == [("isolated:not_floored", True)]
    assert "rounds up" in value_findings(c, 8, lambda v: v == 7, quotient=7.2)[0].cause.text
    assert value_findings(c, 8, lambda v: v == 6, quotient=7.6) == []
    negative = value_findings(c, -3, lambda v: v == 0)
    assert [(f.cause.id, f.decisive) for f in negative] == [("isolated:negative_batch", True)]


# ------------------------------------------------------------- graded submissions

#: Mistakes the library does not hold, as students write them.
EDITS: dict[str, list[tuple[str, str]]] = {
    "kv_at_weights_precision": [(KV_RETURN, KV_RETURN.replace("bytes_per_elem",
                                                              "spec.bytes_per_param"))],
    "kv_context_written_in": [(KV_RETURN, KV_RETURN.replace("context_len", "1024"))],
    "kv_one_layer": [(KV_RETURN, KV_RETURN.replace(" * spec.n_layers", ""))],
    "batch_rounded": [(BATCH_RETURN, "return max(round(free / per_request), 0)")],
    "batch_rounded_up": [(BATCH_RETURN, "return max(-(-free // per_request), 0)")],
    "batch_negative": [(BATCH_RETURN, "return free // per_request")],
    "tp_ignored": [(FREE, "free = gpu_mem_bytes - weight_bytes(spec)")],
    "decode_flops_quadratic": [(DECODE_FLOPS, "return float(4 * N * N * d)  #")],
    "prefill_flops_without_d": [(PREFILL_FLOPS, "return float(4 * N * N)")],
    "bytes_without_o_write": [(PREFILL_BYTES, PREFILL_BYTES.replace("4 * N * d", "3 * N * d"))],
    "bytes_in_elements": [(PREFILL_BYTES, PREFILL_BYTES.replace(" * bpe", "")),
                          (DECODE_BYTES, DECODE_BYTES.replace(" * bpe", ""))],
    "no_final_norm": [("final_norm = d\n", "final_norm = 0\n")],
    "weights_always_fp16": [("return param_count(spec) * spec.bytes_per_param",
                             "return param_count(spec) * 2")],
}  # fmt: skip

#: Each mistake's checks and the only causes they may name there.
NAMED: dict[str, dict[str, list[str]]] = {
    "kv_at_weights_precision": {"1.3": ["isolated:ignores_bytes_per_elem"],
                                "1.12": ["isolated:ignores_bytes_per_elem"]},
    "kv_context_written_in": {"1.3": ["isolated:ignores_context_len"]},
    "kv_one_layer": {"1.3": ["isolated:ignores_n_layers"]},
    "batch_rounded": {"1.4": ["isolated:not_floored"], "1.12": ["isolated:not_floored"]},
    "batch_rounded_up": {"1.4": ["isolated:not_floored"], "1.5": ["isolated:not_floored"],
                         "1.12": ["isolated:not_floored"]},
    "batch_negative": {"1.4": ["isolated:negative_batch"]},
    "tp_ignored": {"1.5": ["isolated:ignores_tp"], "1.12": ["isolated:ignores_tp"]},
    "decode_flops_quadratic": {"1.6": ["isolated:N_dependence"],
                               "1.13": ["isolated:N_dependence"]},
    "prefill_flops_without_d": {"1.6": ["isolated:ignores_d"]},
    "bytes_without_o_write": {"1.7": ["isolated:short_by_n_d"], "1.13": ["isolated:short_by_n_d"]},
    "bytes_in_elements": {"1.7": ["isolated:ignores_bpe"], "1.13": ["isolated:ignores_bpe"]},
    "no_final_norm": {"1.1": ["isolated:short_by_d_model"],
                      "1.12": ["isolated:short_by_d_model"]},
    "weights_always_fp16": {"1.12": ["isolated:ignores_bytes_per_param"]},
}  # fmt: skip

#: What each isolated cause's sentence says: the function and the narrowed place.
SAYS = {
    "isolated:ignores_bytes_per_elem": "kv_cache_bytes_per_request ignores bytes_per_elem",
    "isolated:ignores_context_len": "kv_cache_bytes_per_request ignores context_len",
    "isolated:ignores_n_layers": "kv_cache_bytes_per_request ignores n_layers",
    "isolated:not_floored": "where the handout floors it",
    "isolated:negative_batch": "returns a negative batch",
    "isolated:ignores_tp": "max_batch_size ignores tp",
    "isolated:N_dependence": "attention_flops depends on N in another way",
    "isolated:ignores_d": "attention_flops ignores d",
    "isolated:short_by_n_d": "attention_bytes is short by exactly N * d * bpe bytes",
    "isolated:ignores_bpe": "attention_bytes ignores bpe",
    "isolated:short_by_d_model": "param_count is short by exactly d_model",
    "isolated:ignores_bytes_per_param": "weight_bytes ignores bytes_per_param",
}


@pytest.fixture
def graded(tmp_path) -> Callable[[str], object]:
    from tests.conftest import patched_solution

    def run(name: str):
        submission = patched_solution(tmp_path / "submission", "question1.py", EDITS[name])
        numbers = set(NAMED[name])
        return grade_checks(submission, tmp_path / "out", "part1", numbers)

    return run


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_mistake_nobody_listed_is_named_by_isolation(graded, name: str) -> None:
    """The check fails, names exactly the isolated cause (no known mistake, no answer
    "written in"), and its sentence says where to look."""
    result = graded(name)
    for number, causes in NAMED[name].items():
        test = result.test(number)
        assert test["score"] < test["max_score"], (number, result.output(number))
        assert test["extra_data"]["causes"] == causes, (number, result.output(number))
        for cause in causes:
            assert SAYS[cause] in result.output(number)
        assert "writing it in" not in result.output(number)
        assert all(d not in result.output(number) for d in DIAGNOSES.values())


def test_fp32_exactly_half_is_not_told_it_forgets_the_factor_2(graded) -> None:
    """A cache always sized at the weights' precision comes out exactly half in the fp32
    case, the forgotten factor 2's value: varying bytes_per_elem alone decides."""
    result = graded("kv_at_weights_precision")
    assert DIAGNOSES["kv_missing_factor_2"] not in result.output("1.3")
    assert "doubling bytes_per_elem left your value unchanged" in result.output("1.3")


def test_a_batch_that_ignores_tp_gets_no_tensor_parallel_cause_of_the_library(graded) -> None:
    """The hidden specs' batches of a max_batch_size that ignores tp equal the library's
    TP mistakes on some specs: the TP experiment names the ignored argument alone."""
    result = graded("tp_ignored")
    for number in ("1.5", "1.12"):
        for name in ("tp_weights_replicated", "tp_cache_not_split", "mha_kv_cache"):
            assert DIAGNOSES[name] not in result.output(number)


def test_a_rounded_batch_is_not_blamed_on_the_parameter_count(graded) -> None:
    """Rounding gives one more request; on a hidden spec that equals a two-matrix FFN's
    batch. The student's own weights and cache, floored, are right: the rounding is."""
    result = graded("batch_rounded")
    assert DIAGNOSES["two_matrix_ffn"] not in result.output("1.12")


def test_a_known_mistake_is_still_named_as_the_library_names_it(tmp_path) -> None:
    """The forgotten factor 2 moves with bytes_per_elem: the experiment agrees with the
    library, which keeps its words."""
    from tests.conftest import patched_solution

    mutant = next(m for m in MUTANTS if m.name == "kv_missing_factor_2")
    submission = patched_solution(tmp_path / "submission", "question1.py", list(mutant.edits))
    result = grade_checks(submission, tmp_path / "out", "part1", {"1.3"})
    assert result.test("1.3")["extra_data"]["causes"] == ["kv_missing_factor_2"]


def test_a_right_submission_runs_no_experiment(tmp_path, trace_lines) -> None:
    """Only failing checks vary arguments: grading the reference asks for the cases'
    calls alone (each labelled with its case), a failing grading for more."""
    numbers = {"1.3", "1.4", "1.5", "1.6", "1.7", "1.12"}
    grade_checks(SOLUTION, tmp_path / "ok", "part1", numbers)
    asked = [line["what"] for line in trace_lines() if not line["trusted"]]
    assert asked and all("(" in what for what in asked)

    from tests.conftest import patched_solution

    submission = patched_solution(tmp_path / "submission", "question1.py", EDITS["tp_ignored"])
    before = len(trace_lines())
    grade_checks(submission, tmp_path / "bad", "part1", {"1.5"})
    extra = [line["what"] for line in trace_lines()[before:] if "(" not in line["what"]]
    assert "max_batch_size" in extra


@pytest.fixture(scope="module")
def student_zip(tmp_path_factory: pytest.TempPathFactory):
    """``student.zip`` built from the committed cases and unpacked."""
    import zipfile

    from grader.ta import dist
    from tests.parts.part1.test_student_zip import TOP

    out = tmp_path_factory.mktemp("dist")
    with zipfile.ZipFile(dist.build_student(out=out / "student.zip", check_cases=False)) as zf:
        zf.extractall(out)
    return out / TOP


def test_the_self_check_isolates_through_the_seals(student_zip, tmp_path) -> None:
    """The student's self-check holds no answer in plain form: the experiments and the
    candidates are judged through the seals, so the same cause is named there, and the
    right values appear nowhere in the feedback."""
    from tests.conftest import patched_solution
    from tests.parts.part1.test_student_zip import ANSWERS, forms, selfcheck

    for name, number in (("kv_at_weights_precision", "1.3"), ("batch_rounded", "1.4")):
        submission = patched_solution(tmp_path / name, "question1.py", EDITS[name])
        output = selfcheck(student_zip, submission / "question1.py")[number]["output"]
        (cause,) = NAMED[name][number]
        assert SAYS[cause] in output, output
        assert all(d not in output for d in DIAGNOSES.values())
        for cid, answer in ANSWERS.items():
            if cid.startswith(f"{number} ") and abs(answer["expected"]) >= 100:
                assert all(form not in output for form in forms(answer["expected"])), cid


def test_twins_are_named_together_only_where_the_deciding_experiment_gave_no_answer() -> None:
    from grader.core.feedback_items import Cause
    from grader.parts.part1.causes import twin_candidates

    factor_2 = [Cause("kv_missing_factor_2", "your code forgets the factor 2")]
    fp32 = Call("kv_cache_bytes_per_request", (SPEC, 8192, 4)).bound()
    fp16 = Call("kv_cache_bytes_per_request", (SPEC, 8192, 2)).bound()
    (twin,) = twin_candidates(factor_2, fp32, decided=())
    assert twin.id == "isolated:candidate_ignores_bytes_per_elem"
    assert "if your value doubles when bytes_per_elem doubles" in twin.text
    assert twin_candidates(factor_2, fp32, decided={"bytes_per_elem"}) == []
    assert twin_candidates(factor_2, fp16, decided=()) == []  # the two differ at fp16


def test_a_factor_2_whose_experiment_fails_is_named_with_its_twin(tmp_path) -> None:
    """A cache without the factor 2 whose function refuses bytes_per_elem = 8: the fp32
    case is half, as at the weights' precision, and the experiment that tells them apart
    gets no value. Both are named, with the fact that decides."""
    from tests.conftest import patched_solution

    mutant = next(m for m in MUTANTS if m.name == "kv_missing_factor_2")
    guard = (
        "    if bytes_per_elem not in (1, 2, 4):\n"
        '        raise ValueError("bytes_per_elem must be 1, 2 or 4")\n'
        f"    {KV_RETURN}"
    )
    edits = [*mutant.edits, (f"    {KV_RETURN}", guard)]
    submission = patched_solution(tmp_path / "submission", "question1.py", edits)
    result = grade_checks(submission, tmp_path / "out", "part1", {"1.3"})
    causes = result.test("1.3")["extra_data"]["causes"]
    assert causes == ["kv_missing_factor_2", "isolated:candidate_ignores_bytes_per_elem"]
    assert "if it stays the same, it is the precision" in result.output("1.3")


#: Library mistakes that were also told a mistake they did not make, and what each of
#: these checks names now: its own mistakes alone.
LIBRARY: dict[str, dict[str, list[str]]] = {
    # A KV cache sized as MHA: its batches equal TP's unsplit cache on some inputs; the
    # batch follows from the student's own KV cache, whose value shows MHA alone.
    "mha_kv_cache": {"1.5": ["mha_kv_cache"], "1.12": ["mha_kv_cache"]},
    # TP's unsplit cache: the student's own KV cache is right, so MHA is ruled out.
    "tp_cache_not_split": {"1.5": ["tp_cache_not_split"], "1.12": ["tp_cache_not_split"]},
    # No output head: a two-matrix FFN gives the same batch, not the same weights.
    "no_output_head": {"1.4": ["no_output_head"], "1.12": ["no_output_head"]},
    # The prefill intensity of two mistakes at once is not an answer written in.
    "s_p_once_and_one_flop_per_multiply_add": {
        "1.13": ["multiply_add_one_flop", "s_p_not_round_tripped"]
    },
}


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_a_library_mistake_is_named_without_a_cause_it_did_not_make(tmp_path, name) -> None:
    from tests.conftest import patched_solution

    mutant = next(m for m in load_mutants("part1") if m.name == name)
    submission = patched_solution(tmp_path / "submission", "question1.py", list(mutant.edits))
    result = grade_checks(submission, tmp_path / "out", "part1", set(LIBRARY[name]))
    for number, causes in LIBRARY[name].items():
        assert sorted(result.test(number)["extra_data"]["causes"]) == causes, number
