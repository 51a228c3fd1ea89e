#!/bin/sh
# The cuda profile's benchmark checks, one part per grading, side by side on one GPU, for a
# loan too short for whole paired rounds (benchmarks/gpu_session.sh): every grading writes
# its own results, so what ends within BUDGET seconds comes back even if another does not.
#
#   OUT=results/gpu BUDGET=540 sh benchmarks/gpu_parts.sh
#
# First wave, at once: the reference's Part 4 (check 4.6), the disguised cache-free Parts 3
# and 4, and the closer cache-free designs of Parts 3 and 4 (calibrate's extra baselines).
# Second wave, once the reference's Part 4 ends: the reference's whole grading (every
# check), its wall time. Everything is packed into $OUT/gpu_parts.tgz.
set -u
OUT=${OUT:-results/gpu}
BUDGET=${BUDGET:-540}
WORK=$(mktemp -d)
mkdir -p "$OUT"
began=$(date +%s)
GPU_INFO="$WORK/gpu.txt"
. benchmarks/gpu_env.sh
python3 - "$WORK" <<'PY' > "$WORK/submissions.txt" 2>&1
import sys
from grader.ta.calibrate import cache_free_submission
print("cache_free_part3", cache_free_submission(["part3"]))
print("cache_free_part4", cache_free_submission(["part4"]))
print("closer_part3", cache_free_submission(["part3"], {"part3": "prefix_recomputed_last_logits_only"}))
print("closer_part4", cache_free_submission(["part4"], {"part4": "cache_never_passed_back_recomputes"}))
PY
left() { echo $(( BUDGET - ($(date +%s) - began) )); }
grade() {  # name submission part seconds [extra args]
    name=$1 sub=$2 part=$3 secs=$4; shift 4
    if [ "$secs" -le 0 ]; then echo "$name not started: BUDGET spent" >> "$WORK/steps.txt"; return; fi
    s=$(date +%s)
    timeout -s ABRT "$secs" python3 -m grader grade "$sub" --device cuda --results "$WORK/$name.json" \
        ${part:+--parts $part} "$@" > "$WORK/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - s )) s" >> "$WORK/steps.txt"
}
pack() { tar czf "$OUT/gpu_parts.tgz" -C "$WORK" . ; }
trap pack EXIT
while read -r name path; do
    grade "$name" "$path" "${name##*_}" $(( $(left) - 15 )) --tags benchmark &
done < "$WORK/submissions.txt"
grade reference_part4 solution part4 $(( $(left) - 15 )) --tags benchmark
grade reference_all solution "" $(( $(left) - 15 ))
wait
