#!/usr/bin/env bash
# setup.sh — installs what the build needs (Debian packages), only what is missing.
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ libgtest-dev libssl-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# A real nccl.h, to check ruCCL's own declarations of the NCCL API against it
# (csrc/device/nccl_api.h; NCCL itself is loaded at run time, never linked).
root="$(cd "$(dirname "$0")/.." && pwd)"
nccl_dir="$root/.deps/nccl"
if [ ! -f "$nccl_dir/include/nccl.h" ]; then
  tmp="$(mktemp -d)"
  if python3 -m pip download -q --no-deps -d "$tmp" nvidia-nccl-cu13 >/dev/null 2>&1; then
    mkdir -p "$nccl_dir/include"
    python3 - "$tmp" "$nccl_dir/include" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    open(sys.argv[2] + "/nccl.h", "wb").write(z.read("nvidia/nccl/include/nccl.h"))
PY
    echo "setup: nccl.h from $(basename "$tmp"/*.whl)"
  else
    echo "setup: WARNING: could not download nvidia-nccl-cu13; the NCCL header check will not be built"
  fi
  rm -rf "$tmp"
fi
