#!/bin/sh
# Gradings of the cuda profile, side by side on one GPU, for a loan too short for whole
# paired rounds (benchmarks/gpu_session.sh): every grading writes its own results, so what
# ends within BUDGET seconds comes back even if another does not.
#
#   OUT=results/gpu BUDGET=540 sh benchmarks/gpu_parts.sh
#   FIRST="reference_all cache_free_part4" AFTER="" OUT=... sh benchmarks/gpu_parts.sh
#
# FIRST: gradings started at once; the last one named is waited for, then AFTER's run one
# by one. A name is WHO_WHAT: WHO is reference (the solution), cache_free (the disguised
# cache-free design of calibrate) or closer (calibrate's extra baseline, parts 3 and 4);
# WHAT is partN (that part's benchmark check) or all (reference: every check; the others:
# every benchmark check). By default: the cache-free and closer designs of Parts 3 and 4
# and the reference's Part 4, then the reference's whole grading. Everything is packed into
# $OUT/gpu_parts.tgz. Results of several loans add up: `python -m grader calibrate
# --reference-results reference_*.json --baseline-results cache_free_*.json closer_*.json`
# (docs/benchmarks.md).
set -u
OUT=${OUT:-results/gpu}
BUDGET=${BUDGET:-540}
FIRST=${FIRST:-cache_free_part3 cache_free_part4 closer_part3 closer_part4 reference_part4}
AFTER=${AFTER-reference_all}
WORK=$(mktemp -d)
mkdir -p "$OUT"
began=$(date +%s)
GPU_INFO="$WORK/gpu.txt"
. benchmarks/gpu_env.sh
# Each name as: name submission parts tags ("-" for none).
python3 - $FIRST $AFTER <<'PY' > "$WORK/plan.txt" 2>> "$WORK/steps.txt"
import sys
from grader.ta.calibrate import BENCHMARK_PARTS, EXTRA_BASELINES, cache_free_submission
for name in sys.argv[1:]:
    who, what = name.rsplit("_", 1)
    parts = list(BENCHMARK_PARTS) if what == "all" else [what]
    if who == "reference":
        path = "solution"
    elif who == "cache_free":
        path = cache_free_submission(parts)
    else:  # closer: calibrate's extra baseline of one part
        path = cache_free_submission(parts, {p: EXTRA_BASELINES[p][0] for p in parts})
    tags = "-" if name == "reference_all" else "benchmark"
    print(name, path, "-" if what == "all" else what, tags)
PY
left() { echo $(( BUDGET - ($(date +%s) - began) )); }
grade() {  # name: its line of the plan, graded within what is left of BUDGET
    set -- $(grep "^$1 " "$WORK/plan.txt")
    name=$1 sub=$2 part=$3 tags=$4 secs=$(( $(left) - 15 ))
    if [ "$secs" -le 0 ]; then echo "$name not started: BUDGET spent" >> "$WORK/steps.txt"; return; fi
    [ "$part" = - ] && part=""
    [ "$tags" = - ] && tags=""
    s=$(date +%s)
    timeout -s ABRT "$secs" python3 -m grader grade "$sub" --device cuda --results "$WORK/$name.json" \
        ${part:+--parts $part} ${tags:+--tags $tags} > "$WORK/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - s )) s" >> "$WORK/steps.txt"
}
pack() { tar czf "$OUT/gpu_parts.tgz" -C "$WORK" . ; }
trap pack EXIT
last=""
for name in $FIRST; do
    [ -n "$last" ] && grade "$last" &
    last=$name
done
[ -n "$last" ] && grade "$last"
for name in $AFTER; do grade "$name"; done
wait
