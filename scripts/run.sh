#!/usr/bin/env bash
# run.sh — the main job from a fresh clone: set up, build, run examples/all_reduce.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
"$root/build/all_reduce"
