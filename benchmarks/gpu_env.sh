# Sourced by the GPU scripts (gpu_session.sh, gpu_parts.sh) on a lent GPU machine: what
# its image lacks, installed from the wheels in .whl/ (see gpu_session.sh's header); each
# check's verdict and time printed as it ends; a stack dump of the grader if a step times
# out; and the GPU, driver and torch written to the file $GPU_INFO names.
WHEELS=${WHEELS:-.whl}  # another folder of wheels, or none that exists: install nothing
if [ -d "$WHEELS" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 KVGRADER_PROGRESS=1 PYTHONFAULTHANDLER=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; } > "$GPU_INFO" 2>&1
