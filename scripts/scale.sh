#!/usr/bin/env bash
# scale.sh — sessions of many single-peer node processes on this machine, through
# ruccl-perf (orchestrator, one process per node): for each size, registration time,
# resident memory and sockets per process (median, and the largest), and the 8 B
# all-reduce latency with the tree and the ring strategy between nodes.
#
#   scripts/scale.sh [SIZES...]        # default: 64 256 1024; build/ruccl-perf must exist
#
# RUCCL_TRANSPORT=tcp forces TCP between the processes (default: shared memory, one
# host).  A run that fails prints FAILED in its row and the script exits 1.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
perf="${RUCCL_PERF:-$root/build/ruccl-perf}"
[ -x "$perf" ] || { echo "scale.sh: $perf not built (./scripts/build.sh)" >&2; exit 2; }
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(64 256 1024)
transport=${RUCCL_TRANSPORT:-shm}
log=$(mktemp -d)
failed=0
rows=()
for n in "${sizes[@]}"; do
  declare -A lat=()
  scale_line=""
  for s in tree ring; do
    out="$log/n$n-$s.txt"
    t0=$(date +%s)
    if timeout 1200 "$perf" -c all_reduce -n 1 -N "$n" -s "$s" -b 8 -e 8 -w 5 -i 20 >"$out" 2>&1; then
      lat[$s]=$(awk '$1 == 8 {print $6; exit}' "$out")
      [ "$s" = tree ] && scale_line=$(grep -m1 '^# scale:' "$out")
    else
      lat[$s]="FAILED"
      failed=1
      echo "scale.sh: $n processes, $s: failed; the end of its output:" >&2
      tail -n 5 "$out" >&2
    fi
    echo "scale.sh: $n processes, $s: $(($(date +%s) - t0)) s" >&2
  done
  # "# scale: N of N processes reported: registration A s median, B s longest; resident
  #  memory C MB median, D MB largest; sockets E median, F most"
  read -r reg_med reg_max rss_med rss_max sock_med sock_max < <(
    sed -E 's/.*registration ([0-9.]+) s median, ([0-9.]+) s longest; resident memory ([0-9.]+) MB median, ([0-9.]+) MB largest; sockets ([0-9]+) median, ([0-9]+) most.*/\1 \2 \3 \4 \5 \6/' <<<"$scale_line")
  rows+=("| $n | $transport | ${reg_med:-?} / ${reg_max:-?} | ${rss_med:-?} / ${rss_max:-?} | ${sock_med:-?} / ${sock_max:-?} | ${lat[tree]} | ${lat[ring]} |")
  unset lat
done
echo
echo "ruccl-perf, 8 B all_reduce, one peer per process, $(nproc) cores ($(date -u '+%F'))"
echo "| processes | between them | registration s (median / longest) | resident MB per process (median / largest) | sockets per process (median / most) | tree µs | ring µs |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
if [ "$failed" -ne 0 ]; then echo "scale.sh: the runs' output is in $log"; else rm -rf "$log"; fi
exit "$failed"
