#!/usr/bin/env bash
# shrink_soak.sh [ROUNDS] — the kill test of issue 30 in a loop, release build: a node
# killed (SIGKILL) mid all-reduce, then agree, shrink and an all-reduce at world 3,
# ROUNDS times (default 100) over its four forms (4 nodes of 1 or 2 peers, shared
# memory and TCP).  Prints the count of rounds passed; exit 0 when all did.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-100}"
"$root/scripts/build.sh" >/dev/null
repeat=$(( (rounds + 3) / 4 ))
log="$(mktemp)"
set +e
"$root/build/ruccl_tests" --gtest_filter='MultiNode/Recovery.KilledNodeMidAllReduce*' --gtest_repeat="$repeat" \
  >"$log" 2>&1
rc=$?
set -e
passed=$(grep -c '^\[       OK \]' "$log" || true)
failed=$(grep -c '^\[  FAILED  \] MultiNode' "$log" || true)
echo "shrink soak: $(( repeat * 4 )) rounds, $passed passed, $failed failed (log: $log)"
exit $rc
