#!/usr/bin/env bash
# run_checks.sh — the CUDA checks, on a machine with a GPU, in one go:
#
#   bash tests/gpu/run_checks.sh          # from the repository root; results under $OUT
#
#   env        what the machine has (torch must see a GPU)
#   core       the core, its tests and examples built with CUDA in build-gpu
#              (cmake -DRUCCL_CUDA=ON -DRUCCL_CUDA_ARCHS=90, Ninja else Makefiles)
#   extension  ruccl_pg built in place with CUDA (RUCCL_CUDA=1 setup.py build_ext),
#              alongside the core
#   example    build-gpu/all_reduce --device cuda, RUCCL_DEBUG=INFO
#   gtest      build-gpu/ruccl_tests --gtest_filter='Cuda*:Device*' (Cuda.OnePeerThroughNccl:
#              NCCL at world size 1, with torch's libnccl as RUCCL_NCCL_LIBRARY)
#   pytest     tests/python/test_cuda.py (two processes on GPU 0 through torch)
#   perf       same-GPU all-reduce of 4 ranks, 256 MB FP32, by build-gpu/ruccl-perf -d cuda,
#              then 2 processes on GPU 0 asking for NCCL (RUCCL_PATH=nccl): they must
#              fall back to host staging and say why; 64 MB
#   kernel     build-gpu/ruccl-cuda-reduce-bench: the same-device reduction kernels alone
#              (4 ranks, 256 MB FP32), timed with events next to a device-to-device copy
#   bench      bench/gpu_bench.py: the table of ruCCL's numbers next to the copy rates
#              and gloo measured in the same run, with their targets
#
# Each step prints PASS or FAIL and the run goes on; a step runs under `timeout`, at
# most its own cap and never past the whole run's budget (RUCCL_GPU_CHECK_BUDGET_S,
# default 450 s).  Everything is logged to $OUT/gpu_checks.log (each step's output
# also to $OUT/<step>.log).  The exit status is 1 when any step failed.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
LOG=$OUT/gpu_checks.log
: >"$LOG"
BUDGET_S=${RUCCL_GPU_CHECK_BUDGET_S:-450}
JOBS=${RUCCL_GPU_CHECK_JOBS:-16}
START=$(date +%s)
PY=${PYTHON:-python3}

for d in /usr/local/cuda/bin /usr/local/cuda-13/bin; do
  if [ -x "$d/nvcc" ]; then
    PATH=$d:$PATH
    export CUDA_HOME=${CUDA_HOME:-${d%/bin}}
    break
  fi
done
export PATH
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS MAX_JOBS=$JOBS RUCCL_CUDA_ARCHS=90 OMP_NUM_THREADS=1

# What the build needs that a GPU image may lack, brought along in $DEPS (filled on a
# Debian machine by tests/gpu/gather_deps.sh: OpenSSL's headers in openssl/include,
# GoogleTest's source in googletest; nothing of it is used where the machine has its own):
#   - libcrypto's headers: taken from $DEPS, linked against the machine's libcrypto.so.3
#     (through a libcrypto.so link in $DEPS/openssl/lib); CPATH and LIBRARY_PATH reach
#     setup.py's compiler, OPENSSL_ROOT_DIR CMake's FindOpenSSL;
#   - GoogleTest: built from $DEPS/googletest and installed in $GTEST_PREFIX (s_core).
DEPS=${RUCCL_GPU_DEPS:-$ROOT/.gpu-deps}
GTEST_PREFIX=
if ! echo '#include <openssl/evp.h>' | cc -E -x c - >/dev/null 2>&1 && [ -d "$DEPS/openssl/include/openssl" ]; then
  crypto=$(ldconfig -p 2>/dev/null | awk '/libcrypto\.so\.3 .*x86-64/ {print $NF; exit}')
  if [ -n "$crypto" ]; then
    mkdir -p "$DEPS/openssl/lib"
    ln -sf "$crypto" "$DEPS/openssl/lib/libcrypto.so"
    export CPATH=$DEPS/openssl/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$DEPS/openssl/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
    export OPENSSL_ROOT_DIR=$DEPS/openssl
  fi
fi
if ! ls /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake \
    /usr/local/lib/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1 && [ -f "$DEPS/googletest/CMakeLists.txt" ]; then
  GTEST_PREFIX=$DEPS/gtest-install
  export CMAKE_PREFIX_PATH=$GTEST_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
fi

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# step NAME CAP FUNCTION: runs FUNCTION (a shell function of this script) in a bash
# under `timeout`, its output in $OUT/NAME.log, and records PASS or FAIL in
# $OUT/NAME.status.
step() {
  local name=$1 cap=$2 fn=$3 left t rc began why
  left=$((BUDGET_S - ($(date +%s) - START)))
  t=$((left < cap ? left : cap))
  if [ "$t" -lt 10 ]; then
    echo "FAIL no time left in the ${BUDGET_S} s budget" >"$OUT/$name.status"
    say "FAIL $name: no time left in the ${BUDGET_S} s budget"
    return 1
  fi
  began=$(date +%s)
  timeout --kill-after=10 "$t" bash -c "set -o pipefail; $(declare -f "$fn" nccl_library site_file); $fn" >"$OUT/$name.log" 2>&1
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "PASS $(($(date +%s) - began)) s" >"$OUT/$name.status"
  else
    why="exit code $rc"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after $t s"; fi
    echo "FAIL $why, after $(($(date +%s) - began)) s" >"$OUT/$name.status"
  fi
  return "$rc"
}

# report NAME [LINES]: the step's verdict, its output into the log, and on a failure
# (or when LINES is given) the last lines of its output.
report() {
  local name=$1 lines=${2:-0} status
  status=$(cat "$OUT/$name.status" 2>/dev/null || echo "FAIL did not run")
  {
    echo "---- $name: output ----"
    cat "$OUT/$name.log" 2>/dev/null
    echo "---- $name: end ----"
  } >>"$LOG"
  say "${status%% *} $name (${status#* })"
  case $status in FAIL*) [ "$lines" -gt 0 ] || lines=30 ;; esac
  if [ "$lines" -gt 0 ] && [ -f "$OUT/$name.log" ]; then
    tail -n "$lines" "$OUT/$name.log" | sed 's/^/    /'
  fi
}

# ---- the steps (each runs in its own bash: exported variables only) ----------------------

s_env() {
  date -u
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  command -v nvcc && nvcc --version | tail -n 2
  cmake --version | head -n 1
  command -v ninja && ninja --version
  "$PY" -c 'import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")
ok = torch.cuda.is_available()
print("torch sees", torch.cuda.device_count(), "CUDA devices:",
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
sys.exit(0 if ok else 1)'
}

s_core() {
  local gen=Ninja
  command -v ninja >/dev/null || gen="Unix Makefiles"
  if [ -n "$GTEST_PREFIX" ] && [ ! -f "$GTEST_PREFIX/lib/cmake/GTest/GTestConfig.cmake" ]; then
    echo "run_checks: GoogleTest from $DEPS/googletest"
    cmake -S "$DEPS/googletest" -B "$DEPS/gtest-build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$GTEST_PREFIX" -DCMAKE_INSTALL_LIBDIR=lib >/dev/null &&
      cmake --build "$DEPS/gtest-build" -j "$JOBS" >/dev/null && cmake --install "$DEPS/gtest-build" >/dev/null ||
      echo "run_checks: GoogleTest did not build"
  fi
  local args=(-S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release -DRUCCL_CUDA=ON -DRUCCL_CUDA_ARCHS=90)
  # nccl_api.h checked against the nccl.h of the NCCL the tests load (torch's wheel's),
  # rather than whichever one the system has
  local header
  header=$(site_file "nvidia/nccl/include/nccl.h")
  [ -n "$header" ] && args+=("-DRUCCL_NCCL_INCLUDE_DIR=${header%/nccl.h}")
  if [ -f build-gpu/CMakeCache.txt ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=$gen\$" build-gpu/CMakeCache.txt; then
    rm -rf build-gpu
  fi
  if ! cmake "${args[@]}"; then
    echo "run_checks: configure failed; again without the GoogleTest suite (is GTest installed?)"
    cmake "${args[@]}" -DRUCCL_TESTS=OFF || return 1
    cmake --build build-gpu -j "$JOBS" || return 1
    echo "run_checks: built without the GoogleTest suite"
    return 1
  fi
  cmake --build build-gpu -j "$JOBS"
}

s_extension() {
  RUCCL_CUDA=1 "$PY" setup.py build_ext --inplace || return 1
  "$PY" -c 'import ruccl_pg, sys
print("ruccl_pg", ruccl_pg.version(), "built with CUDA:", ruccl_pg.built_with_cuda())
sys.exit(0 if ruccl_pg.built_with_cuda() else 1)'
}

s_example() {
  [ -x build-gpu/all_reduce ] || { echo "build-gpu/all_reduce was not built"; return 1; }
  RUCCL_DEBUG=INFO build-gpu/all_reduce --device cuda 2>&1 | tee "$OUT/example.txt" || return 1
  # 4 logical ranks of one process on GPU 0: the path the agreement chose
  grep -m1 'takes the same-device path' "$OUT/example.txt" || { echo "not the same-device path"; return 1; }
}

# The NCCL that torch's wheel brought (not on the loader's path by itself), for the
# programs that do not load torch.
nccl_library() { site_file "nvidia/nccl/lib/libnccl.so*" "torch/lib/libnccl.so*"; }

# site_file PATTERN...: the first file matching one of the patterns (globs relative to
# a site-packages directory of $PY), directory by directory, names sorted; else "".
site_file() {
  "$PY" - "$@" <<'PYEOF'
import glob, os, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()]
found = [p for d in dirs for p in sorted(sum((glob.glob(os.path.join(d, pat)) for pat in sys.argv[1:]), []))]
print(found[0] if found else "")
PYEOF
}

s_gtest() {
  [ -x build-gpu/ruccl_tests ] || { echo "build-gpu/ruccl_tests was not built"; return 1; }
  RUCCL_NCCL_LIBRARY=${RUCCL_NCCL_LIBRARY:-$(nccl_library)}
  export RUCCL_NCCL_LIBRARY
  echo "RUCCL_NCCL_LIBRARY=$RUCCL_NCCL_LIBRARY"
  build-gpu/ruccl_tests --gtest_filter='Cuda*:Device*' --gtest_color=no | tee "$OUT/gtest.txt" || return 1
  # a filter that matched nothing passes in GoogleTest: not here; nor do skipped CUDA
  # tests (no usable GPU) on the machine these checks are for
  grep -Eq '^\[  PASSED  \] [1-9][0-9]* test' "$OUT/gtest.txt" || return 1
  if grep -q '^\[  SKIPPED \] Cuda\.' "$OUT/gtest.txt"; then
    echo "run_checks: CUDA tests were skipped (no usable GPU?)"
    return 1
  fi
}

s_pytest() {
  "$PY" -c 'import pytest' || { echo "pytest is not installed for $PY: the CUDA cases cannot run"; return 1; }
  RUCCL_CUDA=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest tests/python/test_cuda.py -q -rs \
    -p no:cacheprovider | tee "$OUT/pytest.txt" || return 1
  # on the machine these checks are for, a skipped case is a check not made
  if grep -q '^SKIPPED' "$OUT/pytest.txt"; then
    echo "run_checks: CUDA test cases were skipped (reasons above)"
    return 1
  fi
}

s_perf() {
  [ -x build-gpu/ruccl-perf ] || { echo "build-gpu/ruccl-perf was not built"; return 1; }
  # 4 threads on GPU 0 (the same-device path), then 2 processes on GPU 0 (host-staged);
  # each run measures its reference copies (device-to-device, pinned) itself
  RUCCL_DEBUG=INFO build-gpu/ruccl-perf -c all_reduce -n 4 -d cuda -b 268435456 -e 268435456 -w 2 -i 10 \
    >"$OUT/perf.txt" 2>"$OUT/perf_debug.txt" || { cat "$OUT/perf.txt"; tail -n 20 "$OUT/perf_debug.txt"; return 1; }
  cat "$OUT/perf.txt"
  grep -m1 'takes the same-device path' "$OUT/perf_debug.txt" || { echo "not the same-device path"; return 1; }
  # asked for NCCL, two processes on one GPU fall back to host staging, saying why
  RUCCL_NCCL_LIBRARY=${RUCCL_NCCL_LIBRARY:-$(nccl_library)} RUCCL_PATH=nccl RUCCL_DEBUG=INFO \
    build-gpu/ruccl-perf -c all_reduce -N 2 -n 1 -d cuda -b 67108864 -e 67108864 -w 2 -i 10 \
    >"$OUT/perf_staged.txt" 2>"$OUT/perf_staged_debug.txt" || { tail -n 20 "$OUT/perf_staged_debug.txt"; return 1; }
  cat "$OUT/perf_staged.txt"
  grep -m1 'RUCCL_PATH=nccl cannot carry this call: participants 0 and 1 share a GPU' "$OUT/perf_staged_debug.txt" ||
    { echo "no fallback line from two processes on one GPU asking for NCCL"; return 1; }
  local busbw
  busbw=$(sed -n 's/.*busbw at [0-9]* B (out of place): \([0-9.]*\) GB\/s = .* device-to-device.*/\1/p' "$OUT/perf.txt" | tail -n 1)
  for f in perf.txt perf_staged.txt; do
    if ! grep -q 'Out of bounds values : 0 OK' "$OUT/$f"; then
      echo "ruccl-perf reported wrong values ($f)"
      return 1
    fi
  done
  echo "${busbw:-n/a}" >"$OUT/same_gpu_busbw"
}

s_kernel() {
  [ -x build-gpu/ruccl-cuda-reduce-bench ] || { echo "build-gpu/ruccl-cuda-reduce-bench was not built"; return 1; }
  # the same-device reduction kernels alone (4 ranks, 256 MB float32) next to a copy;
  # every variant's output is checked bit for bit
  build-gpu/ruccl-cuda-reduce-bench 256 4 50
}

s_bench() {
  local same=n/a
  [ -s "$OUT/same_gpu_busbw" ] && same=$(cat "$OUT/same_gpu_busbw")
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" bench/gpu_bench.py --same-gpu-busbw "$same" \
    --json "$OUT/gpu_bench.json"
}

export ROOT OUT JOBS PY DEPS GTEST_PREFIX

# ---- the run ------------------------------------------------------------------------------

say "run_checks: $(date -u '+%F %T') UTC in $ROOT, results in $OUT, budget ${BUDGET_S} s"
[ -n "${OPENSSL_ROOT_DIR:-}" ] && say "run_checks: libcrypto's headers from $OPENSSL_ROOT_DIR"
[ -n "$GTEST_PREFIX" ] && say "run_checks: GoogleTest built from $DEPS/googletest"
step env 60 s_env
report env 12

# the core (with its tests) and the extension build side by side
step extension 240 s_extension &
ext_pid=$!
step core 240 s_core
wait "$ext_pid"
report core 5
report extension 3

step example 45 s_example
report example 8
step gtest 90 s_gtest
report gtest 6
step pytest 200 s_pytest
report pytest 20
step perf 90 s_perf
report perf 12
step kernel 60 s_kernel
report kernel 14
step bench 150 s_bench
report bench 12

say ""
say "run_checks: $(($(date +%s) - START)) s in all"
failed=0
for name in env core extension example gtest pytest perf kernel bench; do
  status=$(cat "$OUT/$name.status" 2>/dev/null || echo "FAIL did not run")
  say "  $(printf '%-10s' "$name") $status"
  case $status in FAIL*) failed=1 ;; esac
done
if [ "$failed" -ne 0 ]; then
  say "run_checks: FAILED"
  exit 1
fi
say "run_checks: all steps passed"
