#!/bin/sh
# Gradings of the cuda profile, side by side on one GPU, for a loan too short for whole
# paired rounds (benchmarks/gpu_session.sh): every grading writes its own results, so what
# ends within BUDGET seconds comes back even if another does not.
#
#   OUT=results/gpu BUDGET=540 sh benchmarks/gpu_parts.sh
#   FIRST="reference_all cache_free_part4" AFTER="" OUT=... sh benchmarks/gpu_parts.sh
#   FIRST="reference_all cache_free_all closer_all" AFTER="" ROUNDS=3 sh benchmarks/gpu_parts.sh
#
# FIRST: gradings started at once, ROUNDS times (default once), each round waiting for
# all of its gradings; then AFTER's run one by one. A name is WHO_WHAT
# (benchmarks/gpu_plan.py): WHO is reference (the solution), cache_free (the disguised
# cache-free design of calibrate) or closer (calibrate's extra baseline, parts 3 and 4);
# WHAT is partN (that part's benchmark check) or all (reference: every check; the others:
# every benchmark check). By default: the cache-free and closer designs of Parts 3 and 4
# and the reference's Part 4, then the reference's whole grading. Results are NAME.json
# (NAME_rR.json with several rounds); everything is packed into $OUT/gpu_parts.tgz.
# Results of several loans add up: `python -m grader calibrate --reference-results
# reference_*.json --baseline-results cache_free_*.json closer_*.json` proposes thresholds
# and re-judges every grading with today's values (docs/benchmarks.md).
set -u
# Every round of every benchmark timed, even once a design's calls have lost the check:
# calibration proposes thresholds from the cache-free designs' ratios.
export KVGRADER_FULL_TIMING=${KVGRADER_FULL_TIMING-1}  # preset empty: stop early
OUT=${OUT:-results/gpu}
BUDGET=${BUDGET:-540}
FIRST=${FIRST:-cache_free_part3 cache_free_part4 closer_part3 closer_part4 reference_part4}
AFTER=${AFTER-reference_all}
ROUNDS=${ROUNDS:-1}
WORK=$(mktemp -d)
mkdir -p "$OUT"
began=$(date +%s)
GPU_INFO="$WORK/gpu.txt"
. benchmarks/gpu_env.sh
python3 benchmarks/gpu_plan.py $FIRST $AFTER > "$WORK/plan.txt" 2>> "$WORK/steps.txt" || {
    cat "$WORK/steps.txt" >&2; exit 2; }
left() { echo $(( BUDGET - ($(date +%s) - began) )); }
grade() {  # name [result name]: its line of the plan, graded within what is left of BUDGET
    set -- $(grep "^$1 " "$WORK/plan.txt") "${2:-$1}"
    name=$1 sub=$2 part=$3 tags=$4 result=$5 secs=$(( $(left) - 15 ))
    if [ "$secs" -le 0 ]; then echo "$result not started: BUDGET spent" >> "$WORK/steps.txt"; return; fi
    [ "$part" = - ] && part=""
    [ "$tags" = - ] && tags=""
    s=$(date +%s)
    timeout -s ABRT "$secs" python3 -m grader grade "$sub" --device cuda --results "$WORK/$result.json" \
        ${part:+--parts $part} ${tags:+--tags $tags} > "$WORK/$result.log" 2>&1
    echo "$result rc=$? $(( $(date +%s) - s )) s" >> "$WORK/steps.txt"
}
pack() { tar czf "$OUT/gpu_parts.tgz" -C "$WORK" . ; }
trap pack EXIT
round=1
while [ "$round" -le "$ROUNDS" ]; do
    for name in $FIRST; do
        if [ "$ROUNDS" -gt 1 ]; then grade "$name" "${name}_r$round" & else grade "$name" & fi
    done
    wait
    round=$((round + 1))
done
for name in $AFTER; do grade "$name"; done
