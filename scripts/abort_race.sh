#!/usr/bin/env bash
# abort_race.sh — the ABORT racing a payload, at length: two node processes of two
# peers each (through the orchestrator program), ROUNDS sessions (default 1000) of an
# all-reduce of MB megabytes (default 64) that a thread of peer 1 aborts 0-4 ms in;
# every peer of both nodes must end every round with RUCCL_ERR_ABORTED (never a lost
# peer, a protocol error or an ABORT notice read as data).  Over shared memory and
# over TCP; prints each run's rounds and how many were aborted inside the all-reduce.
#
#   scripts/abort_race.sh [ROUNDS [MB]]      # build/ must hold ruccl-test-node, ruccl-orchestrator
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds=${1:-1000}
mb=${2:-64}
node="$root/build/ruccl-test-node"
orch="$root/build/ruccl-orchestrator"
[ -x "$node" ] && [ -x "$orch" ] || { echo "abort_race.sh: build first (./scripts/build.sh)" >&2; exit 2; }
export RUCCL_SECRET="abort-race-$$"
log=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
"$orch" --listen "127.0.0.1:$port" >"$log/orch.txt" 2>&1 &
orch_pid=$!
trap 'kill $orch_pid 2>/dev/null' EXIT
sleep 0.3
failed=0
for transport in shm tcp; do
  t0=$(date +%s)
  env_t=()
  [ "$transport" = tcp ] && env_t=(RUCCL_TRANSPORT=tcp)
  env "${env_t[@]}" RUCCL_RACE_ROUNDS="$rounds" RUCCL_RACE_MB="$mb" \
    "$node" "127.0.0.1:$port" 2 "race-$transport" 0,1 abortrace >"$log/a.txt" 2>&1 &
  a=$!
  env "${env_t[@]}" RUCCL_RACE_ROUNDS="$rounds" RUCCL_RACE_MB="$mb" \
    "$node" "127.0.0.1:$port" 2 "race-$transport" 2,3 abortrace >"$log/b.txt" 2>&1 &
  b=$!
  wait $a; ra=$?
  wait $b; rb=$?
  summary=$(grep -h "rounds," "$log/a.txt" "$log/b.txt" | sort | tr '\n' ';')
  echo "abort_race.sh: $transport, $rounds rounds of $mb MB: exit $ra $rb, $(($(date +%s) - t0)) s; $summary"
  if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then
    failed=1
    tail -n 5 "$log/a.txt" "$log/b.txt" >&2
  fi
done
rm -rf "$log"
exit $failed
