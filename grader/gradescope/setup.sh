#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image
# (Ubuntu 22.04). It installs CPU-only torch and the grader's dependencies,
# creates the unprivileged user that runs student code, and makes the source
# tree (hidden test cases included) readable by root only.
#
#   setup.sh             the full set-up (Gradescope)
#   setup.sh --only-user only the user and permission steps (python -m grader run-local)
set -euo pipefail
cd "$(dirname "$0")"

if [ "${1:-}" != "--only-user" ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3 python3-pip
    # CPU wheels only: no CUDA packages on an image without a GPU.
    python3 -m pip install --no-cache-dir torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu
    python3 -m pip install --no-cache-dir -r requirements.txt
fi

bash grader/gradescope/create_worker_user.sh kvgrader
chmod -R go-rwx .
chmod 755 setup.sh run_autograder
