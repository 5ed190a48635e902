#!/usr/bin/env bash
# fuzz.sh [--time SECONDS | --runs N] [TARGET...] — builds the libFuzzer targets of
# tests/fuzz (clang, ASan+UBSan, build-fuzz/) and runs each from a copy of its
# committed seed corpus (tests/fuzz/corpus/TARGET), then prints, per target, the
# inputs executed and whether it found anything (a crash leaves its input in
# build-fuzz/findings/TARGET).  CI (scripts/test.sh) runs every target 15 s; the
# figure the project reports is --runs 10000000.  --seeds rewrites the seed corpus
# from the encoders (tests/fuzz/make_seeds.c).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
budget=(-max_total_time=60)
targets=()
seeds=0
while [ $# -gt 0 ]; do
  case "$1" in
    --time) budget=(-max_total_time="$2"); shift 2 ;;
    --runs) budget=(-runs="$2"); shift 2 ;;
    --seeds) seeds=1; shift ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(frame handshake join_table agreement shm_ring)
if ! command -v clang >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang >/dev/null
fi
CC=clang CXX=clang++ "$root/scripts/build.sh" "$root/build-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRUCCL_FUZZ=ON \
  -DRUCCL_CUDA=OFF -DRUCCL_TESTS=OFF -DRUCCL_EXAMPLES=OFF
if [ "$seeds" -eq 1 ]; then
  "$root/build-fuzz/fuzz_make_seeds" "$root/tests/fuzz/corpus"
fi
work="$root/build-fuzz/work"
status=0
printf '%-12s %14s %10s  %s\n' target executions seconds result
for t in "${targets[@]}"; do
  rm -rf "$work/$t"
  mkdir -p "$work/$t" "$root/build-fuzz/findings/$t"
  cp "$root/tests/fuzz/corpus/$t/"* "$work/$t/"
  log="$root/build-fuzz/findings/$t.log"
  start=$(date +%s)
  if ASAN_OPTIONS=detect_leaks=1 "$root/build-fuzz/fuzz_$t" "${budget[@]}" -print_final_stats=1 \
       -artifact_prefix="$root/build-fuzz/findings/$t/" "$work/$t" >"$log" 2>&1; then
    result="no findings"
  else
    result="FOUND: see $log and build-fuzz/findings/$t/"
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  printf '%-12s %14s %10s  %s\n' "$t" "${runs:-?}" "$(( $(date +%s) - start ))" "$result"
done
exit $status
