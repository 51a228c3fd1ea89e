#!/usr/bin/env bash
# Creates the unprivileged account that runs student code (the Gradescope
# set-up calls this as root). Idempotent. Usage: create_worker_user.sh [NAME]
set -euo pipefail
name="${1:-kvgrader}"
if id -u "$name" >/dev/null 2>&1; then
    echo "user $name already exists"
    exit 0
fi
useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$name"
echo "created user $name ($(id -u "$name"))"
