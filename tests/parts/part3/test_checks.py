"""End-to-end grading of Part 3 (KV caching in Llama 3): the solution, the blank
skeleton and broken submissions."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from grader.core.points import POINTS, part_total
from grader.core.thresholds import load_thresholds
from grader.runtime.timing import MIN_ROUNDS
from grader.sandbox.sandbox import Limits
from tests.conftest import SOLUTION, Graded, grade_checks, patched_solution, run_grade

CHECKS = set(POINTS["part3"])
LIMITS = Limits(request_timeout_s=30.0, startup_timeout_s=30.0)


def test_solution_gets_full_marks(solution_graded) -> None:
    tests = solution_graded.part_tests("part3")
    assert {t["number"] for t in tests} == CHECKS
    assert [t["number"] for t in tests if t["status"] != "passed"] == []
    assert solution_graded.part_score("part3") == part_total("part3") == 30


def test_benchmark_is_tagged_and_reports_every_batch_size(solution_graded) -> None:
    bench = solution_graded.test("3.11")
    assert set(bench["tags"]) == {"part3", "benchmark"}
    record = solution_graded.data["extra_data"]["benchmarks"]["3.11"]
    keys = [c["key"] for c in record["criteria"]]
    # Per batch: the speedup and the time over the reference's; no memory ratio on cpu.
    assert keys == [k for b in (1, 8, 16) for k in (f"part3.min_speedup.{b}",
                                                     "part3.max_vs_reference")]  # fmt: skip
    assert all(c["passed"] for c in record["criteria"])
    assert len([t for t in record["timings"] if t.startswith("the reference, batch")]) == 3
    for batch in (1, 8, 16):
        assert re.search(rf"batch {batch} speedup \(cpu time\): [0-9.]+x \(runs", bench["output"])
        timing = record["timings"][f"batch {batch}, with the cache"]
        assert timing["peak_bytes"] is not None  # the worker's RSS growth, sampled by the parent


def grade_with_stalled_cached_runs(tmp_path: Path, stall: str) -> Graded:
    """3.11 alone, for a correct cache whose 2nd and 3rd cached batch-1 runs (the first
    two timed ones) also run ``stall`` (indented lines)."""
    edit = (
        "        self.set_kv_caching(kv_caching)\n",
        "        self.set_kv_caching(kv_caching)\n"
        "        if kv_caching and bsz == 1 and max_prompt_len >= 100:\n"
        "            calls = globals()['_cached_runs'] = globals().get('_cached_runs', 0) + 1\n"
        "            if calls in (2, 3):\n"
        "                import time\n" + stall,
    )
    submission = patched_solution(tmp_path / "submission", "llama/generation.py", [edit])
    return run_grade(
        submission, tmp_path / "out", parts=["part3"], limits=LIMITS,
        tags=frozenset({"benchmark"}),
    )  # fmt: skip


def test_benchmark_confirms_a_miss_caused_by_stalls(tmp_path: Path) -> None:
    # The stalled runs burn 0.4 s of CPU, as a page-fault storm or a garbage collection
    # can: the median of three misses, and the confirmation rounds must win the points back.
    graded = grade_with_stalled_cached_runs(
        tmp_path,
        "                start = time.process_time()\n"
        "                while time.process_time() - start < 0.4:\n"
        "                    pass\n",
    )
    record = graded.data["extra_data"]["benchmarks"]["3.11"]
    confirm = load_thresholds("cpu")["part3"]["confirm_repeats"]
    assert graded.test("3.11")["status"] == "passed", graded.output("3.11")
    # More rounds were timed, as many as the bound needed to clear the stalls, at most
    # confirm_repeats; the verdict is on all of them.
    extra = record["extra_rounds"]
    assert 0 < extra <= confirm
    timing = record["timings"]["batch 1, with the cache"]
    assert len(timing["runs_s"]) == 3 + extra
    assert sum(r > 0.4 for r in timing["cpu_runs_s"]) == 2
    # No stall there: decided once its bound cleared the limits, in at least MIN_ROUNDS
    # rounds (a busy machine may take it into the confirmation rounds too, never past them).
    assert MIN_ROUNDS <= len(record["timings"]["batch 8, with the cache"]["runs_s"]) <= 3 + confirm
    assert f"timed {extra} more times" in graded.output("3.11")


def test_benchmark_waiting_for_the_cpu_costs_nothing(tmp_path: Path) -> None:
    # The same two cached runs now stall 0.4 s without running, as a process waiting for
    # a core on a busy machine does: the verdicts are on CPU time, so nothing is missed.
    graded = grade_with_stalled_cached_runs(tmp_path, "                time.sleep(0.4)\n")
    record = graded.data["extra_data"]["benchmarks"]["3.11"]
    assert graded.test("3.11")["status"] == "passed", graded.output("3.11")
    timing = record["timings"]["batch 1, with the cache"]
    runs = timing["runs_s"]  # one round may settle it: the CPU clock saw no stall
    stalled = [i for i, r in enumerate(runs) if r > 0.4]
    assert stalled == list(range(min(2, len(runs))))  # the wall clock saw the stalls ...
    assert max(timing["cpu_runs_s"]) < 0.4  # ... the CPU clock did not
    # Judged on the recorded runs, not on whether load elsewhere asked for a confirmation
    # round: the verdict's speedup is the CPU-time medians' ratio, never the wall clock's,
    # over the rounds it was decided in (a decided criterion keeps its figure while other
    # criteria take more rounds).
    plain = record["timings"]["batch 1, without the cache"]
    (speedup,) = [c for c in record["criteria"] if c["key"] == "part3.min_speedup.1"]
    rounds = speedup["rounds"]
    assert 1 <= rounds <= len(plain["cpu_runs_s"])
    on_cpu = statistics.median(plain["cpu_runs_s"][:rounds]) / statistics.median(
        timing["cpu_runs_s"][:rounds]
    )
    assert speedup["ratio"]["median"] == pytest.approx(on_cpu)


def test_blank_skeleton_scores_zero_without_crashing(blank_graded) -> None:
    tests = blank_graded.part_tests("part3")
    assert {t["number"] for t in tests} == CHECKS
    assert blank_graded.part_score("part3") == 0
    assert "not implemented yet" in blank_graded.output("3.2")


def grade_edit(tmp_path: Path, file: str, edits: list[tuple[str, str]]):
    """The solution with ``edits``, graded on Part 3 without the timed benchmark (3.11):
    it runs after every other check, and none of the tests using this reads it."""
    submission = patched_solution(tmp_path / "submission", file, edits)
    return run_grade(
        submission, tmp_path / "out", parts=["part3"], limits=LIMITS,
        skip_tags=frozenset({"benchmark"}),
    )  # fmt: skip


def test_build_without_clear_errors_loses_only_3_1(tmp_path: Path) -> None:
    graded = grade_numbers(
        tmp_path,
        "llama/model.py",
        [
            (
                "        unknown = sorted(set(params) - known)\n",
                "        params = {k: v for k, v in params.items() if k in known}\n"
                "        unknown = []\n",
            )
        ],
        {"3.1", "3.2"},
    )
    assert graded.score("3.1") == 0
    assert "unknown params.json key" in graded.output("3.1")
    assert graded.score("3.2") == 4  # the checkpoint itself still loads


def test_a_model_py_alone_names_the_file_still_to_upload(tmp_path: Path) -> None:
    """A flat ``model.py`` is taken as ``llama/model.py``; ``generation.py``, which a
    student must edit too, is named as missing, with what to upload."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.py").write_text("x = 1\n")
    graded = run_grade(tmp_path / "sub", tmp_path / "out", parts=["part3"], limits=LIMITS)
    assert graded.data["score"] == 0
    message = graded.output("3.1")
    assert "llama/generation.py is not in your submission" in message
    assert "Upload llama/model.py and llama/generation.py" in message


def test_generate_returning_strings_is_explained(tmp_path: Path) -> None:
    graded = grade_numbers(
        tmp_path,
        "llama/generation.py",
        [
            (
                'return [{"generation": tokenizer.decode(t), "tokens": t} for t in out]',
                "return [tokenizer.decode(t) for t in out]",
            )
        ],
        {"3.2", "3.5"},
    )
    assert graded.score("3.5") == 0
    assert 'one dict per prompt with a "generation" string' in graded.output("3.5")
    assert graded.score("3.2") == 4


def test_a_timed_run_with_wrong_outputs_does_not_count(tmp_path: Path) -> None:
    edit = (
        '        return [{"generation": tokenizer.decode(t), "tokens": t} for t in out]',
        '        return [{"generation": tokenizer.decode(t) + str(i), "tokens": t}\n'
        "                for i, t in enumerate(out)]",
    )
    submission = patched_solution(tmp_path / "submission", "llama/generation.py", [edit])
    graded = run_grade(submission, tmp_path / "out", parts=["part3"], limits=LIMITS,
                       tags=frozenset({"benchmark"}))  # fmt: skip
    assert graded.score("3.11") == 0
    assert "returned other text than the reference in row(s) [1]" in graded.output("3.11")


def test_all_nan_logits_never_pass(tmp_path: Path) -> None:
    """NaN compared with a tolerance is False both ways: every check must read it as a miss."""
    nan = (
        "return self.output(self.norm(h)).float()  # (B, T, vocab)",
        'return self.output(self.norm(h)).float() * float("nan")  # (B, T, vocab)',
    )
    graded = grade_numbers(tmp_path, "llama/model.py", [nan], {"3.2", "3.3", "3.5", "3.6"})
    for number in ("3.2", "3.3", "3.5", "3.6"):
        assert graded.score(number) == 0, number
    assert "NaN" in graded.output("3.2") or "nan" in graded.output("3.6").lower()


def test_a_cache_kept_when_switched_off_loses_3_1(tmp_path: Path) -> None:
    """set_kv_caching freeing the caches when switched on instead of off: the outputs are
    right, but the worker's resident memory, read by the grader, does not shrink."""
    keep = ("            if not enabled:\n", "            if enabled:\n")
    graded = grade_numbers(tmp_path, "llama/model.py", [keep], {"3.1", "3.5"})
    assert graded.score("3.1") == 0
    assert "set_kv_caching(False) must drop every layer's cache" in graded.output("3.1")
    assert graded.score("3.5") == graded.test("3.5")["max_score"]


def test_a_prompt_of_max_seq_len_tokens_is_accepted(tmp_path: Path) -> None:
    """Meta's guard refuses only prompts longer than max_seq_len; one that refuses a prompt
    of exactly max_seq_len tokens loses 3.5 on the full batch."""
    guard = ("if max_prompt_len > params.max_seq_len:", "if max_prompt_len >= params.max_seq_len:")
    graded = grade_numbers(tmp_path, "llama/generation.py", [guard], {"3.1", "3.5"})
    assert graded.score("3.5") == 0
    assert "the longest exactly max_seq_len = 128" in graded.output("3.5")
    assert graded.score("3.1") == graded.test("3.1")["max_score"]


def test_a_cache_of_every_query_head_loses_3_1(tmp_path: Path) -> None:
    """GQA expanded before the cache: the cache holds n_heads heads instead of n_kv_heads
    (right logits, twice the memory on the public model), which the resident memory read
    by the grader shows; the rest of the part is right."""
    expand = [
        ("return (self.max_batch_size, self.max_seq_len, self.n_kv_heads, self.head_dim)",
         "return (self.max_batch_size, self.max_seq_len, self.n_heads, self.head_dim)"),
        ("self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk",
         "self.cache_k[:bsz, start_pos : start_pos + seqlen] = repeat_kv(xk, self.n_rep)"),
        ("self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv",
         "self.cache_v[:bsz, start_pos : start_pos + seqlen] = repeat_kv(xv, self.n_rep)"),
        ("keys = repeat_kv(keys, self.n_rep)  # (B, T_total, H, D)",
         "keys = keys if keys.shape[2] == self.n_heads else repeat_kv(keys, self.n_rep)"),
        ("values = repeat_kv(values, self.n_rep)",
         "values = values if values.shape[2] == self.n_heads else repeat_kv(values, self.n_rep)"),
    ]  # fmt: skip
    graded = grade_edit(tmp_path, "llama/model.py", expand)
    assert graded.score("3.1") == 0
    assert "The cache must hold n_kv_heads heads" in graded.output("3.1")
    assert re.search(r"grew by [\d.]+ MiB more with kv_caching=True than without: 2\.\d\dx",
                     graded.output("3.1"))  # fmt: skip
    lost = {t["number"] for t in graded.part_tests("part3") if t["score"] < t["max_score"]}
    assert lost == {"3.1"}


def test_peak_memory_is_reported_once_per_batch_with_where_it_was_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """3.11's memory line is the course's figure (the worker's CUDA peak), named as the
    worker's own report, and is printed once per batch, not once per confirmation round."""
    import types

    from grader.core.thresholds import load_thresholds
    from grader.parts.part3.checks import Part3Benchmark
    from grader.runtime.timing import Sample, Timing

    check = object.__new__(Part3Benchmark)
    check.ctx = types.SimpleNamespace(device="cuda")
    bench = load_thresholds("cuda")["part3"]

    def timing(mib: int) -> Timing:
        return Timing(tuple(Sample(0.1, mib * 2**20, None, "worker", 9 * 2**30) for _ in "abc"))

    check.report_peak_memory(bench, 8, {"batch 8, without the cache": timing(400),
                                        "batch 8, with the cache": timing(300)})  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "batch 8 peak memory, cached / cache-free (CUDA peak, reported by your process, "
        f"not graded): 0.75x (runs 0.75-0.75x) (the course expects at most "
        f"{bench['max_peak_memory_ratio']:g}x)"
    ]


def grade_numbers(tmp_path: Path, file: str, edits: list[tuple[str, str]], numbers: set[str]):
    """The solution with ``edits``, graded on Part 3's checks ``numbers`` only."""
    submission = patched_solution(tmp_path / "submission", file, edits)
    return run_grade(submission, tmp_path / "out", parts=["part3"], limits=LIMITS,
                     numbers=frozenset(numbers))  # fmt: skip


def test_a_float64_cache_is_blamed_on_its_dtype_not_on_gqa(tmp_path: Path) -> None:
    """The cache of the right shape in float64: twice the memory, as a GQA-expanded cache
    on the public model, but the shapes the process reports are right, so the dtype is
    named."""
    from grader.ta.mutants import load_mutants

    [mutant] = [m for m in load_mutants("part3") if m.name == "cache_float64"]
    graded = grade_numbers(tmp_path, mutant.file, list(mutant.edits), {"3.1"})
    output = graded.output("3.1")
    assert graded.score("3.1") == 0
    assert "in float64 where the model computes in float32" in output, output
    assert mutant.diagnosis in output
    assert "grouped-query attention" not in output
    assert graded.test("3.1")["extra_data"]["causes"] == ["cache_float64"]


def test_a_left_padded_batch_is_named_not_a_missing_bos(tmp_path: Path) -> None:
    left_pad = [
        ("""        tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long, device=device)
        for k, t in enumerate(prompt_tokens):
            tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long, device=device)
        is_prompt = tokens != pad_id  # (B, total_len)
""", """        tokens = torch.zeros((bsz, total_len), dtype=torch.long, device=device)  # 0 pads
        for k, t in enumerate(prompt_tokens):
            tokens[k, max_prompt_len - len(t) : max_prompt_len] = torch.tensor(t, device=device)
        is_prompt = torch.zeros_like(tokens, dtype=torch.bool)
        is_prompt[:, :max_prompt_len] = True
        min_prompt_len = max_prompt_len
"""),
        ("            start = len(prompt_tokens[k])\n", "            start = max_prompt_len\n"),
    ]  # fmt: skip
    graded = grade_numbers(tmp_path, "llama/generation.py", left_pad, {"3.5"})
    output = graded.output("3.5")
    assert graded.score("3.5") == 0
    assert "the batch was left-padded: generate fed the model 0 as the first token" in output
    assert "without BOS" not in output
    assert "left_padded" in graded.test("3.5")["extra_data"]["causes"]


def test_a_float16_softmax_that_overflows_is_not_blamed_on_set_kv_caching(
    tmp_path: Path,
) -> None:
    """A softmax in float16 without the max subtracted overflows on one prompt in both
    modes (check 3.5's); a switched model gives what a model built for the mode gives,
    so check 3.8 keeps its points and says where the text goes wrong."""
    fp16 = ("scores = F.softmax(scores.float(), dim=-1).type_as(xq)",
            "e = torch.exp(scores.half())\n"
            "        scores = (e / e.sum(dim=-1, keepdim=True)).type_as(xq)")  # fmt: skip
    graded = grade_numbers(tmp_path, "llama/model.py", [fp16], {"3.5", "3.8"})
    assert graded.score("3.5") == 0
    output = graded.output("3.8")
    assert graded.score("3.8") == graded.test("3.8")["max_score"], output
    assert "set_kv_caching" not in output
    assert "the switch is right; the text is wrong from the start (see check 3.5)" in output


def test_rope_applied_again_to_the_cached_keys_keeps_3_10(tmp_path: Path) -> None:
    """Keys rotated twice before the cache: the logits are wrong (other checks), but
    generate samples its own logits as Meta's code does, so 3.10, judged by those
    logits, keeps its points and blames no temperature."""
    twice = ("self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk",
             "self.cache_k[:bsz, start_pos : start_pos + seqlen] = "
             "apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)[1]")  # fmt: skip
    graded = grade_numbers(tmp_path, "llama/model.py", [twice], {"3.3", "3.10"})
    assert graded.score("3.3") < graded.test("3.3")["max_score"]  # the logits are wrong
    output = graded.output("3.10")
    assert graded.score("3.10") == graded.test("3.10")["max_score"], output
    assert "temperature" not in output.lower()


def test_the_handouts_generation_runs_once_per_mode_for_3_5_to_3_7(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checks 3.5, 3.6 and 3.7 read the text, per-step logits and forward calls of one
    generate of the handout's prompts in each mode, instead of asking for it three times."""
    from grader.runtime import client

    asked: list[tuple] = []
    request = client.WorkerClient.request

    def counting(self, header, arrays=None, **kw):
        if header.get("op") == "generate" and header.get("model") == "public":
            asked.append((header["kv_caching"], tuple(header["prompts"]), header["max_gen_len"]))
        return request(self, header, arrays, **kw)

    monkeypatch.setattr(client.WorkerClient, "request", counting)
    limits = Limits(request_timeout_s=30.0, startup_timeout_s=30.0)
    graded = grade_checks(SOLUTION, tmp_path / "out", "part3", {"3.5", "3.6", "3.7"}, limits)
    assert [graded.score(n) for n in ("3.5", "3.6", "3.7")] == [
        POINTS["part3"][n] for n in ("3.5", "3.6", "3.7")
    ]
    assert len(asked) >= 2 and len(set(asked)) == len(asked), asked  # none asked twice


def test_the_benchmark_starts_a_worker_of_its_own() -> None:
    """3.11's batches of 16 do not come on top of what the other checks left in the
    part's worker (3.1's probe caches among them): the grading's memory budget."""
    import types

    from grader.parts.part3.checks import Part3Benchmark

    stopped: list[str] = []
    ctx = types.SimpleNamespace(device="cpu", stop_worker=stopped.append)
    bound = type("Bound", (Part3Benchmark,), {"ctx": ctx, "__module__": Part3Benchmark.__module__})
    bound.setUpClass()
    assert stopped == ["part3"]
