#!/usr/bin/env bash
# run.sh [DIR] — the main job from a fresh clone: installs what it needs (Debian
# packages, torch, scikit-learn, tqdm, matplotlib, the ruccl_pg extension), then
#   1. trains the example's real model (an MLP on scikit-learn's bundled digits) with 2
#      ranks on CPU, from scratch to the end: a progress bar, the test accuracy, the
#      plot (DIR/full/training.png), and each rank's final checksum;
#   2. trains it again under torchrun --max-restarts 1, with rank 1 killed (SIGKILL)
#      inside an all-reduce at step 437 of 1000: torchrun restarts both ranks, they
#      continue from the newest checkpoint (step 400), and must end with the same
#      checksums as step 1, bit for bit ("checksums agree"), or this fails.
# DIR defaults to a fresh temporary directory (it must not exist yet).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/setup_python.sh"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
dir="${1:-$(mktemp -d)/collective-training}"
if [ -e "$dir" ]; then
  echo "run.sh: $dir already exists; give a new directory" >&2
  exit 2
fi
mkdir -p "$dir"
py="${PYTHON:-python3}"
example="$root/examples/collective_training.py"
# Real authentication between the ranks (else the backend shares a secret through
# torch's store, and says so): a fresh random secret unless one is given.
export RUCCL_SECRET="${RUCCL_SECRET:-$("$py" -c 'import secrets; print(secrets.token_hex(16))')}"

echo "=== 1. train, 2 ranks, uninterrupted: $dir/full"
full="$("$py" "$example" train "$dir/full" | sort)"
echo "$full"
echo "plot: $dir/full/training.png"

echo "=== 2. the same job under torchrun --max-restarts 1, rank 1 killed (SIGKILL) inside the all-reduce of step 437: $dir/interrupted"
log="$dir/interrupted.log"
interrupted="$(RUCCL_FAULT=collective:437:1:kill "$py" -m torch.distributed.run --standalone --nproc-per-node 2 \
  --max-restarts 1 "$example" train "$dir/interrupted" --no-progress 2>"$log" | sort)" || { cat "$log" >&2; exit 1; }
grep -E "RUCCL_FAULT|exitcode|resumed|accuracy" "$log" || true
echo "$interrupted"
if [ -n "$full" ] && [ "$full" = "$interrupted" ]; then
  echo "checksums agree: killed at step 437, restarted by torchrun, the job ended bit for bit where the uninterrupted one did"
else
  echo "checksums DIFFER between the uninterrupted and the restarted job" >&2
  exit 1
fi
