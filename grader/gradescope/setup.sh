#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image
# (base image Ubuntu 22.04), from the unpacked zip in /autograder/source.
#
# The image's Python is 3.11, installed here from Ubuntu's own packages: the
# system python3 of 22.04 is 3.10, and the locked transformers needs >= 3.11.
# Everything (the grader and the student's worker) runs on that interpreter,
# in a virtual environment holding exactly the versions of requirements.txt
# (the lock, `make lock`), with CPU-only torch from PyTorch's CPU index.
# Then it creates the unprivileged user that runs student code and makes the
# source tree (hidden test cases included) readable by root only.
#
#   setup.sh                     the full set-up (Gradescope)
#   setup.sh --no-system         the same without apt-get (`python -m grader run-local`,
#                                on a machine that has a python3.11 already)
#
#   KVGRADER_VENV         the image's virtual environment (default: ROOT/venv, next to source/)
#   KVGRADER_BASE_PYTHON  the interpreter it is made from (default: python3.11)
#   KVGRADER_TORCH_INDEX  where CPU-only torch comes from (default: PyTorch's CPU index)
#   KVGRADER_PIP_CACHE=1  keep pip's download cache (run-local); the image keeps none
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# Run from the unpacked zip (ROOT/source) or from a copy one level up (ROOT).
if [ -d "$here/grader" ]; then source_dir="$here"; else source_dir="$here/source"; fi
root="$(dirname "$source_dir")"
venv="${KVGRADER_VENV:-$root/venv}"
python="${KVGRADER_BASE_PYTHON:-python3.11}"
torch_index="${KVGRADER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
lock="$source_dir/requirements.txt"
if [ "${KVGRADER_PIP_CACHE:-0}" != 1 ]; then export PIP_NO_CACHE_DIR=1; fi

if [ "${1:-}" != "--no-system" ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        python3.11 python3.11-venv ca-certificates
fi

if ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    echo "setup.sh: $python is not a Python 3.11, the version every pin of the lock is for" >&2
    exit 1
fi

# The virtual environment, rebuilt only when the lock changed.
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ "$(cat "$venv/.kvgrader-lock" 2>/dev/null)" != "$want" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    pip=("$venv/bin/python" -m pip --disable-pip-version-check)
    # torch alone from the CPU index (never the CUDA build), then every locked package.
    "${pip[@]}" install --quiet --no-deps --retries 2 --index-url "$torch_index" \
        "$(grep '^torch==' "$lock")"
    "${pip[@]}" install --quiet -r "$lock"
    "${pip[@]}" check
    echo "$want" > "$venv/.kvgrader-lock"
fi
# The worker user starts the same interpreter.
chmod -R go+rX "$venv"

if [ "$(id -u)" = 0 ]; then
    bash "$source_dir/grader/sandbox/create_worker_user.sh" kvgrader 8
fi
chmod -R go-rwx "$source_dir"
chmod 755 "$source_dir/setup.sh" "$source_dir/run_autograder"
