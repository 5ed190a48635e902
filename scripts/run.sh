#!/usr/bin/env bash
# run.sh [DIR] — the main job from a fresh clone: installs what it needs (Debian
# packages, torch, the ruccl_pg extension), then runs the 2-rank collective training
# example on CPU: `run` (update 1, save into DIR, update 2), then `resume` (restore DIR,
# update 2), and checks that both end with the same per-rank checksums, bit for bit.
# DIR defaults to a fresh temporary directory (it must not exist yet).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/setup_python.sh"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
dir="${1:-$(mktemp -d)/collective-training-state}"
py="${PYTHON:-python3}"
# Real authentication between the ranks (else the backend shares a secret through
# torch's store, and says so): a fresh random secret unless one is given.
export RUCCL_SECRET="${RUCCL_SECRET:-$("$py" -c 'import secrets; print(secrets.token_hex(16))')}"
echo "=== run $dir"
ran="$("$py" "$root/examples/collective_training.py" run "$dir")"
echo "$ran"
echo "=== resume $dir"
resumed="$("$py" "$root/examples/collective_training.py" resume "$dir")"
echo "$resumed"
if [ "$ran" = "$resumed" ] && [ -n "$ran" ]; then
  echo "checksums agree: resume ended bit for bit where run ended"
else
  echo "checksums DIFFER between run and resume" >&2
  exit 1
fi
