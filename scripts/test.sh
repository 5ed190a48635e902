#!/usr/bin/env bash
# test.sh — every test from a fresh clone: the GoogleTest suite and the example,
# in a release build (with the CUDA adapter where nvcc is installed), under
# AddressSanitizer + UndefinedBehaviorSanitizer, and under ThreadSanitizer (both
# CPU-only); the fuzz targets for a short budget; then the PyTorch backend: its pytest suite (real processes,
# torchrun) and PyTorch's own distributed test suite against it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
jobs="${RUCCL_TEST_JOBS:-2}"

run_suite() { # name build-dir cmake-args...
  local name="$1" dir="$2"
  shift 2
  echo "=== $name ==="
  "$root/scripts/build.sh" "$dir" "$@"
  (cd "$dir" && ctest --output-on-failure -j "$jobs")
}

# The release build has the CUDA adapter where nvcc is installed (its GPU tests skip
# without a GPU); the sanitizer builds are CPU-only, so both kinds of build are tested.
run_suite release "$root/build" -DCMAKE_BUILD_TYPE=Release -DRUCCL_CUDA=AUTO
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_suite asan+ubsan "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRUCCL_ASAN=ON -DRUCCL_CUDA=OFF
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_suite tsan "$root/build-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRUCCL_TSAN=ON -DRUCCL_CUDA=OFF
echo "=== fuzz targets, 15 s each (scripts/fuzz.sh) ==="
"$root/scripts/fuzz.sh" --time 15

echo "=== torch backend ==="
"$root/scripts/setup_python.sh"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$root"
python3 -m pytest tests/python -q -p no:cacheprovider
echo "=== PyTorch's distributed test suite, backend ruccl, 2 ranks ==="
WORLD_SIZE=2 python3 -m pytest tests/torch_suite/run_distributed_test.py -q -rs -p no:cacheprovider
echo "=== PyTorch's distributed test suite, backend ruccl, 3 ranks (the tests that need more than 2) ==="
WORLD_SIZE=3 python3 -m pytest tests/torch_suite/run_distributed_test.py -q -rs -p no:cacheprovider
echo "=== PyTorch's distributed test suite, backend ruccl, 4 ranks (only the tests that need exactly 4) ==="
WORLD_SIZE=4 python3 -m pytest tests/torch_suite/run_distributed_test.py -q -rs -p no:cacheprovider \
  -k "test_new_subgroups_with_group_param or test_gather_object"
