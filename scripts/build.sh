#!/usr/bin/env bash
# build.sh [DIR [CMAKE_ARGS...]] — configures and builds incrementally: DIR is
# configured when it is new, and again whenever CMAKE_ARGS are given (so that they
# hold for a DIR configured before with others).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/build}"
shift || true
if [ ! -f "$dir/build.ninja" ] || [ "$#" -gt 0 ]; then
  cmake -S "$root" -B "$dir" -G Ninja "$@" >/dev/null
fi
cmake --build "$dir"
