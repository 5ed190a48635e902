#!/usr/bin/env bash
# setup_python.sh — the Python side's dependencies (torch pinned: the CPU wheel this
# project builds against), installed only when missing, then the ruccl_pg extension
# built in place (incrementally: the C core in build/torch-core, the shim by torch's
# cpp_extension).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
  echo "setup: installing torch==2.13.0"
  "$py" -m pip install -q torch==2.13.0
fi
for mod in pytest expecttest wheel; do
  "$py" -c "import $mod" 2>/dev/null || { echo "setup: installing $mod"; "$py" -m pip install -q "$mod"; }
done
(cd "$root" && "$py" setup.py -q build_ext --inplace >/dev/null)
