#!/usr/bin/env bash
# check_torch_api.sh WHEEL_OR_DIR — compiles the torch shim (csrc/torch) with
# -fsyntax-only against another torch's headers: a wheel file (any platform: only its
# torch/include is read) or a directory holding torch/include.  How the sources are
# checked against torch 2.11 (the GPU machine's) on a machine that has 2.13.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:?usage: check_torch_api.sh WHEEL_OR_DIR}"
if [ -f "$src" ]; then
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' EXIT
  python3 - "$src" "$dir" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("torch/include/")])
PY
else
  dir="$src"
fi
inc="$dir/torch/include"
grep -h "define TORCH_VERSION_M" "$inc/torch/headeronly/version.h" "$inc/torch/version.h" 2>/dev/null | head -2 || true
# The CUDA build of the shim (RUCCL_TORCH_CUDA) too, where the headers allow: c10's CUDA
# headers (a CPU wheel has them, less the generated cuda_cmake_macros.h, stubbed here)
# and the CUDA toolkit's.
cuda_flags=()
cuda_inc="${CUDA_HOME:-/usr/local/cuda}/include"
if [ -f "$inc/c10/cuda/CUDAStream.h" ] && [ -f "$cuda_inc/cuda_runtime_api.h" ]; then
  stub="$(mktemp -d)"
  mkdir -p "$stub/c10/cuda/impl"
  [ -f "$inc/c10/cuda/impl/cuda_cmake_macros.h" ] ||
    echo "#define C10_CUDA_BUILD_SHARED_LIBS" > "$stub/c10/cuda/impl/cuda_cmake_macros.h"
  cuda_flags=(-DRUCCL_TORCH_CUDA -I"$stub" -I"$cuda_inc")
fi
for f in "$root"/csrc/torch/*.cpp; do
  g++ -fsyntax-only -std=c++17 -I"$inc" -I"$inc/torch/csrc/api/include" -I"$root/include" \
    $(python3-config --includes) "$f"
  echo "ok: $(basename "$f")"
  if [ ${#cuda_flags[@]} -gt 0 ]; then
    g++ -fsyntax-only -std=c++17 "${cuda_flags[@]}" -I"$inc" -I"$inc/torch/csrc/api/include" -I"$root/include" \
      $(python3-config --includes) "$f"
    echo "ok (RUCCL_TORCH_CUDA): $(basename "$f")"
  fi
done
