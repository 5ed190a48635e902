#!/usr/bin/env bash
# setup.sh — installs what the build needs (Debian packages), only what is missing.
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ clang libgtest-dev libssl-dev; do  # clang: the fuzz targets (libFuzzer)
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# A real NCCL: its nccl.h, to check ruCCL's own declarations of the NCCL API against
# it (csrc/device/nccl_api.h), and its libnccl.so.2, which the tests load at run time
# as ruCCL does (nothing links against it).
root="$(cd "$(dirname "$0")/.." && pwd)"
nccl_dir="$root/.deps/nccl"
if [ ! -f "$nccl_dir/include/nccl.h" ] || [ ! -f "$nccl_dir/lib/libnccl.so.2" ]; then
  tmp="$(mktemp -d)"
  if python3 -m pip download -q --no-deps -d "$tmp" nvidia-nccl-cu13 >/dev/null 2>&1; then
    mkdir -p "$nccl_dir/include" "$nccl_dir/lib"
    python3 - "$tmp" "$nccl_dir" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    open(sys.argv[2] + "/include/nccl.h", "wb").write(z.read("nvidia/nccl/include/nccl.h"))
    open(sys.argv[2] + "/lib/libnccl.so.2", "wb").write(z.read("nvidia/nccl/lib/libnccl.so.2"))
PY
    echo "setup: nccl.h and libnccl.so.2 from $(basename "$tmp"/*.whl)"
  else
    echo "setup: WARNING: could not download nvidia-nccl-cu13; the checks against a real NCCL will not be built"
  fi
  rm -rf "$tmp"
fi
