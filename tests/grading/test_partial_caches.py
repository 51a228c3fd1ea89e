"""Caches that do part of the work again, written from their description, must lose the
benchmark points on the cpu profile while the reference keeps them (its 2.11 is checked
by ``tests/parts/part2/test_checks.py`` on the shared graded solution)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grader.core.feedback import CUT_SHORT
from grader.runtime.timing import FULL_TIMING, MIN_ROUNDS
from grader.sandbox.sandbox import Limits
from tests.conftest import (
    FAST_LIMITS,
    PART2_LIMITS,
    grade_checks,
    patched_solution,
    with_profile,
)

PART3_LIMITS = Limits(request_timeout_s=30.0, startup_timeout_s=30.0)

# Part 2: each layer caches its input x (twice, so the pair has the cache's shapes) and
# every step projects every position again with W_k and W_v: right logits, right shapes.
LAYER_INPUT_CACHE = [
    (
        """        k = self.W_k(x)  # (B, T_new, D)
        v = self.W_v(x)  # (B, T_new, D)
        if use_cache and past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=1)  # (B, T_total, D)
            v = torch.cat([past_kv[1], v], dim=1)  # (B, T_total, D)
""",
        """        seen = torch.cat([past_kv[0], x], 1) if use_cache and past_kv is not None else x
        k = self.W_k(seen)  # every position projected again, every step
        v = self.W_v(seen)
""",
    ),
    (
        "        return self.W_o(context), ((k, v) if use_cache else None)\n",
        "        return self.W_o(context), ((seen, seen) if use_cache else None)\n",
    ),
]


# Part 2: the cache is handed back in float64 (twice the bytes of the float32 weights) and
# read back as float32: right logits, right shapes, right values.
FLOAT64_CACHE = [
    (
        """            k = torch.cat([past_kv[0], k], dim=1)  # (B, T_total, D)
            v = torch.cat([past_kv[1], v], dim=1)  # (B, T_total, D)
""",
        """            k = torch.cat([past_kv[0].float(), k], dim=1)  # held in float64
            v = torch.cat([past_kv[1].float(), v], dim=1)
""",
    ),
    (
        "        return self.W_o(context), ((k, v) if use_cache else None)\n",
        "        return self.W_o(context), ((k.double(), v.double()) if use_cache else None)\n",
    ),
]


def every_kth_step(period: int) -> list[tuple[str, str]]:
    """Part 2: generate starts over (a prefill of the whole sequence) every ``period``-th
    step: its forward calls show it once a run is longer than the period."""
    return [("            elif step == 0:\n", f"            elif step % {period} == 0:\n")]


EVERY_8TH_STEP = every_kth_step(8)


def refreshed_in_forward(period: int) -> list[tuple[str, str]]:
    """Part 2: the model's forward keeps the tokens it was fed and, at every ``period``-th
    call after a prefill, runs the whole sequence again without the cache it was handed,
    hands back the new tokens' logits and the fresh cache: its calls look like a cache's,
    one token each, and the cache holds the right keys and values."""
    head = """    def forward(
        self,
        input_ids: torch.Tensor,
        past_kv: list[LayerCache] | None = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, list[LayerCache] | None]:
"""
    wrapper = (
        "    def forward(self, input_ids, past_kv=None, use_cache=False):\n"
        "        t_past = past_kv[0][0].shape[1] if (use_cache and past_kv) else 0\n"
        "        seen = getattr(self, 'seen', None)\n"
        "        if not t_past or seen is None or seen.shape[0] != input_ids.shape[0] \\\n"
        "                or seen.shape[1] < t_past:\n"
        "            self.seen, self.calls = input_ids.clone(), 0\n"
        "        else:\n"
        "            self.seen = torch.cat([seen[:, :t_past], input_ids], dim=1)\n"
        "        self.calls += 1\n"
        f"        if t_past and self.calls % {period} == 0:  # the whole sequence again\n"
        "            logits, fresh = self._forward(self.seen, None, True)\n"
        "            return logits[:, t_past:], fresh\n"
        "        return self._forward(input_ids, past_kv, use_cache)\n"
        "\n" + head.replace("def forward(", "def _forward(")
    )
    return [(head, wrapper)]


# Part 2: every step feeds the last 16 tokens again against a cache shortened to match:
# constant work per step, 16 times a cache's.
LAST_16_AGAIN = [
    (
        "                logits, past_kv = self.decode_one_token(tokens[:, -1:], past_kv)\n",
        "                r = min(16, tokens.shape[1])\n"
        "                kept = [(k[:, : tokens.shape[1] - r], v[:, : tokens.shape[1] - r])\n"
        "                        for k, v in past_kv]\n"
        "                out, past_kv = self.forward(tokens[:, -r:], kept, True)\n"
        "                logits = out[:, -1, :]\n",
    )
]


# Part 4: generate_with_cache throws its cache away every 16 tokens and feeds the whole
# sequence again.
REBUILD_EVERY_16 = [
    (
        "    for _ in range(L):\n        out = model(new, past_key_values=cache, use_cache=True)\n",
        "    for step in range(L):\n"
        "        if step and step % 16 == 0:\n"
        "            cache, new = None, ids  # starts over: the whole sequence again\n"
        "        out = model(new, past_key_values=cache, use_cache=True)\n",
    )
]


def llama_every_kth_step(period: int) -> list[tuple[str, str]]:
    """Part 3: every ``period``-th step sets prev_pos back to 0, so that step feeds the
    whole prefix: its model calls show it once a run is longer than the period."""
    return [
        (
            "            prev_pos = cur_pos\n",
            f"            prev_pos = 0 if (cur_pos - min_prompt_len) % {period} == {period - 1} "
            "else cur_pos\n",
        )
    ]


LLAMA_EVERY_8TH_STEP = llama_every_kth_step(8)


def llama_refreshed_in_forward(period: int) -> list[tuple[str, str]]:
    """Part 3: the model's forward keeps the tokens it was fed and, at every ``period``-th
    call after a prefill, runs the whole prefix again from position 0 (rewriting the cache)
    and hands back the new tokens' logits: its calls look like a cache's, one token each."""
    head = (
        "    @torch.inference_mode()\n    def forward(self, tokens: torch.Tensor, start_pos: int)"
    )
    wrapper = (
        "    @torch.inference_mode()\n"
        "    def forward(self, tokens, start_pos):\n"
        "        if start_pos == 0 or getattr(self, 'seen', None) is None:\n"
        "            self.seen, self.calls = tokens.clone(), 0\n"
        "        else:\n"
        "            self.seen = torch.cat([self.seen[:, :start_pos], tokens], dim=1)\n"
        "        self.calls += 1\n"
        f"        if start_pos and self.calls % {period} == 0:  # the whole prefix again\n"
        "            return self._forward(self.seen, 0)[:, start_pos:]\n"
        "        return self._forward(tokens, start_pos)\n"
        "\n"
        "    def _forward(self, tokens: torch.Tensor, start_pos: int)"
    )
    return [(head, wrapper)]


# Part 3: every cached step feeds its last 16 tokens again (at their own positions, so the
# cache is rewritten with the same values): constant work per step, 16 times a cache's.
LLAMA_LAST_16_AGAIN = [
    (
        "                logits = self(tokens[:, prev_pos:cur_pos], prev_pos)  # new tokens only\n",
        "                start = max(0, min(prev_pos, cur_pos - 16))\n"
        "                logits = self(tokens[:, start:cur_pos], start)  # the last 16 again\n",
    )
]


# Part 3: the cache tensors are filled as they should be (right shapes, right memory), but
# attention reads keys and values projected again, every step, from each layer's inputs
# kept beside them (with RoPE applied again to every position).
LLAMA_LAYER_INPUTS = [
    (
        """            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)
            values = self.cache_v[:bsz, : start_pos + seqlen]
""",
        """            if start_pos == 0:
                self.seen_x, self.seen_f = x, freqs_cis
            else:
                self.seen_x = torch.cat([self.seen_x[:bsz, :start_pos], x], dim=1)
                self.seen_f = torch.cat([self.seen_f[:start_pos], freqs_cis], dim=0)
            total = start_pos + seqlen
            shape = (bsz, total, self.n_kv_heads, self.head_dim)
            every = self.wk(self.seen_x).view(shape)  # every position projected again
            _, keys = apply_rotary_emb(every, every, freqs_cis=self.seen_f)
            values = self.wv(self.seen_x).view(shape)
""",
    )
]


# Part 3: each layer keeps its keys as a list of pieces (the prompt's, then one per step),
# joined when read, and its inputs beside them; the values are projected again from every
# input kept, every step. No tensor holds every position of anything.
LLAMA_VALUES_FROM_INPUT_PIECES = [
    (
        """            if self.cache_k is None or self.cache_k.shape != self._cache_shape():
                self.cache_k = torch.zeros(self._cache_shape(), dtype=xk.dtype, device=xk.device)
                self.cache_v = torch.zeros(self._cache_shape(), dtype=xv.dtype, device=xv.device)
            self.cache_k = self.cache_k.to(xk)
            self.cache_v = self.cache_v.to(xv)
            self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk
            self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv
            keys = self.cache_k[:bsz, : start_pos + seqlen]  # (B, T_total, Hkv, D)
            values = self.cache_v[:bsz, : start_pos + seqlen]
""",
        """            if start_pos == 0:
                self.k_pieces, self.x_pieces = [], []
            self.k_pieces.append(xk)
            self.x_pieces.append(x)
            keys = torch.cat(self.k_pieces, dim=1)  # (B, T_total, Hkv, D)
            seen = torch.cat(self.x_pieces, dim=1)  # (B, T_total, dim)
            total = start_pos + seqlen
            values = self.wv(seen).view(bsz, total, self.n_kv_heads, self.head_dim)
""",
    )
]

# (file, part, edits, a check its right output keeps, the benchmark it loses, why, limits)
DESIGNS = {
    "layer-inputs": ("transformer_skeleton.py", "part2", LAYER_INPUT_CACHE, "2.4", "2.11",
                     "does not hold the keys of the tokens seen", PART2_LIMITS),
    "float64-cache": ("transformer_skeleton.py", "part2", FLOAT64_CACHE, "2.4", "2.11",
                      "2x the memory", PART2_LIMITS),
    "every-8th-step": ("transformer_skeleton.py", "part2", EVERY_8TH_STEP, "2.8", "2.11",
                       "recomputes part of the work", PART2_LIMITS),
    "refreshed-in-forward-32": ("transformer_skeleton.py", "part2", refreshed_in_forward(32),
                                "2.8", "2.11", "does not read its cache", PART2_LIMITS),
    "refreshed-in-forward-64": ("transformer_skeleton.py", "part2", refreshed_in_forward(64),
                                "2.8", "2.11", "does not read its cache", PART2_LIMITS),
    "every-32nd-step": ("transformer_skeleton.py", "part2", every_kth_step(32), "2.8", "2.11",
                        "recomputes part of the work", PART2_LIMITS),
    "every-64th-step": ("transformer_skeleton.py", "part2", every_kth_step(64), "2.8", "2.11",
                        "recomputes part of the work", PART2_LIMITS),
    "last-16-again": ("transformer_skeleton.py", "part2", LAST_16_AGAIN, "2.8", "2.11",
                      "recomputes part of the work", PART2_LIMITS),
    "llama-every-8th-step": ("llama/generation.py", "part3", LLAMA_EVERY_8TH_STEP, "3.8",
                             "3.11", "recomputes part of the work", PART3_LIMITS),
    "llama-every-32nd-step": ("llama/generation.py", "part3", llama_every_kth_step(32), "3.8",
                              "3.11", "recomputes part of the work", PART3_LIMITS),
    "llama-last-16-again": ("llama/generation.py", "part3", LLAMA_LAST_16_AGAIN, "3.8",
                            "3.11", "recomputes part of the work", PART3_LIMITS),
    "llama-refreshed-in-forward-32": ("llama/model.py", "part3",
                                      llama_refreshed_in_forward(32), "3.8", "3.11",
                                      "does not read its cache", PART3_LIMITS),
    "llama-refreshed-in-forward-64": ("llama/model.py", "part3",
                                      llama_refreshed_in_forward(64), "3.8", "3.11",
                                      "does not read its cache", PART3_LIMITS),
    "llama-layer-inputs": ("llama/model.py", "part3", LLAMA_LAYER_INPUTS, "3.8", "3.11",
                           "does not read its cache", PART3_LIMITS),
    "llama-values-from-input-pieces": ("llama/model.py", "part3",
                                       LLAMA_VALUES_FROM_INPUT_PIECES, "3.8", "3.11",
                                       "not a KV cache", PART3_LIMITS),
    "lab-rebuilt-every-16": ("kv_lab.py", "part4", REBUILD_EVERY_16, "4.2", "4.6",
                             "recomputes part of the work", FAST_LIMITS),
}  # fmt: skip


# The same design at another period: graded by `make attack-tests` (CI), not `make test`,
# which keeps one design of each kind and cause per part (see the test below).
SWEEPS = {"refreshed-in-forward-64", "every-32nd-step", "every-64th-step",
          "llama-every-32nd-step", "llama-refreshed-in-forward-64"}  # fmt: skip


# The designs that lose on what their cache holds, before anything is timed.
LOST_BEFORE_TIMING = {"llama-values-from-input-pieces"}


# The designs whose timed benchmark runs themselves feed tokens again.
FED_AGAIN_WHEN_TIMED = {"every-8th-step", "last-16-again", "llama-every-8th-step",
                        "llama-last-16-again", "lab-rebuilt-every-16"}  # fmt: skip


def test_make_test_keeps_every_part_and_cause_of_the_partial_caches() -> None:
    kept = {(DESIGNS[d][1], DESIGNS[d][5]) for d in DESIGNS if d not in SWEEPS}
    assert set(DESIGNS) >= SWEEPS
    assert kept == {(d[1], d[5]) for d in DESIGNS.values()}


@pytest.mark.parametrize(
    "design", [pytest.param(d, marks=[pytest.mark.attacks] if d in SWEEPS else []) for d in DESIGNS]
)
def test_a_partial_cache_loses_the_benchmark(tmp_path: Path, design: str) -> None:
    file, part, edits, kept, lost, why, limits = DESIGNS[design]
    submission = patched_solution(tmp_path / "sub", file, edits)
    graded = grade_checks(submission, tmp_path / "out", part, {kept, lost}, limits)
    assert graded.score(kept) == graded.test(kept)["max_score"], graded.output(kept)
    assert graded.score(lost) == 0
    assert why in graded.output(lost)
    assert "cannot count" in graded.output(lost)
    if design in LOST_BEFORE_TIMING:
        assert lost not in graded.results.extra_data.get("benchmarks", {})
        return
    # Timed runs whose calls feed tokens again lose the check whatever they cost: timing
    # stops there. (A period longer than a timed run shows only in the growth runs.)
    fed_again = design in FED_AGAIN_WHEN_TIMED
    assert (CUT_SHORT in graded.output(lost)) == fed_again, graded.output(lost)
    assert graded.results.extra_data["benchmarks"][lost]["cut_short"] == fed_again


def test_full_timing_times_every_round_of_a_check_its_calls_lose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``KVGRADER_FULL_TIMING=1`` (calibration) a partial cache's runs are timed in
    every round; the verdict and its cause are the same."""
    monkeypatch.setenv(FULL_TIMING, "1")
    file, part, edits, _kept, lost, why, limits = DESIGNS["every-8th-step"]
    submission = patched_solution(tmp_path / "sub", file, edits)
    graded = grade_checks(submission, tmp_path / "out", part, {lost}, limits)
    assert graded.score(lost) == 0 and why in graded.output(lost)
    record = graded.results.extra_data["benchmarks"][lost]
    assert not record["cut_short"] and CUT_SHORT not in graded.output(lost)
    assert len(record["timings"]["with the cache"]["runs_s"]) >= MIN_ROUNDS


@pytest.mark.parametrize(
    ("design", "table", "line"),
    [
        ("llama-last-16-again", "[cpu.part3]", 'min_speedup = { "1" = 90, "8" = 90, "16" = 90 }'),
        ("every-8th-step", "[cpu.part2]", "min_speedup = 90"),
        ("lab-rebuilt-every-16", "[cpu.part4]", "min_speedup = 90"),
    ],
)
def test_a_partial_cache_that_misses_a_threshold_first_is_still_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, design: str, table: str, line: str
) -> None:
    """On a loaded machine a partial cache may miss a timing threshold before its calls are
    judged: the feedback still names what its timed runs' calls show (a threshold no run
    can meet stands in for the load)."""
    from grader.core.thresholds import thresholds_text

    text = thresholds_text()
    start = text.index(table)
    section = text[start : text.index("\n[", start + 1)]
    body = re.sub(r"(?m)^min_speedup = .*$", line, section)
    assert body != section
    with_profile(tmp_path, monkeypatch, table, body)
    file, part, edits, _kept, lost, why, limits = DESIGNS[design]
    submission = patched_solution(tmp_path / "sub", file, edits)
    graded = grade_checks(submission, tmp_path / "out", part, {lost}, limits)
    assert graded.score(lost) == 0
    assert "NOT MET" in graded.output(lost)  # the timing missed first ...
    assert why in graded.output(lost)  # ... and the cause is still named
