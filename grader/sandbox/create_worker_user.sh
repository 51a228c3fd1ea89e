#!/usr/bin/env bash
# Creates the unprivileged accounts that run student code (the Gradescope set-up
# calls this as root): NAME and NAME1 ... NAME<COUNT-1>, one per grading that may
# run at the same time (batch --jobs), so side-by-side gradings never share a user;
# and NAME-ref, the account of the trusted workers (the reference solution timed as
# the yardstick), so that a root grader never runs it as root.
# Idempotent. Usage: create_worker_user.sh [NAME] [COUNT]
set -euo pipefail
name="${1:-kvgrader}"
count="${2:-1}"
users=()
for i in $(seq 0 $((count - 1))); do
    user="$name"
    if [ "$i" -gt 0 ]; then user="$name$i"; fi
    users+=("$user")
done
users+=("$name-ref")
for user in "${users[@]}"; do
    if id -u "$user" >/dev/null 2>&1; then
        echo "user $user already exists"
        continue
    fi
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$user"
    echo "created user $user ($(id -u "$user"))"
done
