#!/usr/bin/env bash
# setup_python.sh — the Python side's dependencies (requirements.txt; torch pinned: the
# CPU wheel this project builds against), installed only when missing, then the ruccl_pg extension
# built in place (incrementally: the C core in build/torch-core, the shim by torch's
# cpp_extension).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -c 'import torch, sys; sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)' 2>/dev/null; then
  echo "setup: installing torch==2.13.0"
  "$py" -m pip install -q torch==2.13.0
fi
# the rest of requirements.txt: the test runner, what the example trainer uses, and
# torchft (optional for users: ruccl_pg.torchft; its tests and drill run where it is)
for pair in pytest:pytest expecttest:expecttest wheel:wheel sklearn:scikit-learn tqdm:tqdm matplotlib:matplotlib \
  torchft:torchft==0.2.0 parameterized:parameterized; do
  mod="${pair%%:*}" pkg="${pair#*:}"
  "$py" -c "import $mod" 2>/dev/null || { echo "setup: installing $pkg"; "$py" -m pip install -q "$pkg"; }
done
(cd "$root" && "$py" setup.py -q build_ext --inplace >/dev/null)
