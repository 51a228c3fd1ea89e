#!/bin/sh
# What a GPU grading costs (issue 44's GPU figures), in one call of under ten minutes on a
# lent GPU machine (wheels in .whl/ as benchmarks/gpu_session.sh's header says):
#
#   OUT=$OUT BUDGET=540 sh benchmarks/gpu_cost.sh
#
# 1. The reference's whole grading with the cuda profile, alone on the GPU: its wall time,
#    each check's time (alone.log), every worker request's time and its worker start
#    (trace_alone.jsonl, KVGRADER_TRACE), and the GPU's memory in use every half second
#    (nvml_alone.csv) beside what each timed run held (NVML) and peaked at (PyTorch) in
#    alone.json.
# 2. With FORKED=1 (the default) and time left: the same grading with its GPU workers
#    forked from a fork server (KVGRADER_FORK_ON_GPU=1): forked.json, forked.log,
#    trace_forked.jsonl. Its server refuses where an import loaded the CUDA driver, and
#    forked.json's sandbox_warnings then say so.
# 3. With what is left of BUDGET: side by side, as a grading cluster shares a GPU, the
#    reference's whole grading again and the cache-free designs of calibrate (every
#    benchmark check; Parts 3 and 4's closer designs too), stopping early as a real
#    grading does: the verdicts, the yardstick included, under load
#    (beside/gpu_parts.tgz, benchmarks/gpu_parts.sh).
set -u
OUT=${OUT:-results/gpu-cost}
BUDGET=${BUDGET:-540}
ALONE=${ALONE:-360}  # seconds the first grading may take
mkdir -p "$OUT"
began=$(date +%s)
GPU_INFO="$OUT/gpu.txt"
. benchmarks/gpu_env.sh
nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader -lms 500 \
    > "$OUT/nvml_alone.csv" 2>&1 &
smi=$!
s=$(date +%s)
KVGRADER_TRACE="$OUT/trace_alone.jsonl" timeout -k 10 "$ALONE" \
    python3 -m grader grade solution --device cuda --results "$OUT/alone.json" \
    > "$OUT/alone.log" 2>&1
echo "reference alone rc=$? $(( $(date +%s) - s )) s" >> "$OUT/steps.txt"
kill "$smi" 2> /dev/null
left=$(( BUDGET - ($(date +%s) - began) - 10 ))
if [ "${FORKED:-1}" = 1 ] && [ "$left" -gt 60 ]; then
    s=$(date +%s)
    KVGRADER_FORK_ON_GPU=1 KVGRADER_TRACE="$OUT/trace_forked.jsonl" timeout -k 10 "$left" \
        python3 -m grader grade solution --device cuda --results "$OUT/forked.json" \
        > "$OUT/forked.log" 2>&1
    echo "reference forked rc=$? $(( $(date +%s) - s )) s" >> "$OUT/steps.txt"
    left=$(( BUDGET - ($(date +%s) - began) - 10 ))
fi
if [ "$left" -gt 90 ]; then
    OUT="$OUT/beside" BUDGET=$left KVGRADER_FULL_TIMING="" AFTER="" \
        FIRST="reference_all cache_free_all closer_part3 closer_part4" sh benchmarks/gpu_parts.sh
    echo "side by side: $(( $(date +%s) - began )) s since the start" >> "$OUT/steps.txt"
fi
cat "$OUT/steps.txt"
