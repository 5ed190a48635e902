#!/usr/bin/env python3
"""shrink_bench.py — from a kill -9 to the first collective of the shrunk group.

N nodes of one peer each (real processes: build/ruccl-test-node, scenario "shrink",
rendezvous through a store kept in a directory) loop 4 MB all-reduces; once every
peer runs, one node gets SIGKILL.  Each survivor stamps (CLOCK_MONOTONIC, the clock
of time.monotonic_ns) the return of the failed all-reduce, the agreement, the shrink
and the first all-reduce of the shrunk group; this script stamps the kill.

    python3 bench/shrink_bench.py --nodes 4 8 --trials 20 [--transport tcp]

Per size: detection (kill -> PEER_LOST returned), agree, shrink, agree + shrink (each
survivor's, from its own call: it includes waiting for the survivors that noticed the
loss later), agree + shrink from the last survivor's call to agree (the protocol's own
time), the first all-reduce of the new group (100 003 floats), and kill -> that
all-reduce done; p50 and p99 over every survivor of every trial (the slowest survivor counts).
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = os.path.join(ROOT, "build", "ruccl-test-node")
STAMPS = re.compile(r"peer (\d+): stamps failed (\d+) agree (\d+) agreed (\d+) shrunk (\d+) done (\d+)")


def trial(n, transport, victim):
    store = tempfile.mkdtemp(prefix="ruccl-shrink-")
    logs = [tempfile.NamedTemporaryFile(prefix="ruccl-shrink-", suffix=".log", delete=False) for _ in range(n)]
    env = dict(os.environ, RUCCL_SECRET="shrink-bench")
    if transport == "tcp":
        env["RUCCL_TRANSPORT"] = "tcp"
    procs = [subprocess.Popen([NODE, "dir:" + store, str(n), "bench", str(k), "shrink", "ring"], env=env,
                              stdout=subprocess.DEVNULL, stderr=logs[k]) for k in range(n)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = "".join(open(l.name).read() for l in logs)
            if all(f"peer {k}: running" in text for k in range(n)):
                break
            time.sleep(0.002)
        else:
            raise RuntimeError("the all-reduces never got under way")
        killed = time.monotonic_ns()
        procs[victim].send_signal(signal.SIGKILL)
        codes = [p.wait(timeout=90) for k, p in enumerate(procs) if k != victim]
        procs[victim].wait()
        text = "".join(open(l.name).read() for k, l in enumerate(logs) if k != victim)
        if any(codes):
            raise RuntimeError(f"survivors exited {codes}:\n{text[-3000:]}")
        stamps = [tuple(int(x) for x in m.groups()[1:]) for m in STAMPS.finditer(text)]
        last_in = max(st[1] for st in stamps) if stamps else 0  # the last survivor to call agree
        rows = []
        for failed, agree, agreed, shrunk, done in stamps:
            rows.append({"detect": failed - killed, "agree": agreed - agree, "shrink": shrunk - agreed,
                         "agree+shrink": shrunk - agree, "from the last caller": shrunk - last_in,
                         "first all-reduce": done - shrunk, "kill->done": done - killed})
        if len(rows) != n - 1:
            raise RuntimeError(f"{len(rows)} survivors stamped, want {n - 1}:\n{text[-3000:]}")
        return rows
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for l in logs:
            os.unlink(l.name)
        subprocess.run(["rm", "-rf", store])


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--transport", choices=["shm", "tcp"], default="shm")
    args = ap.parse_args()
    if not os.path.exists(NODE):
        sys.exit(f"{NODE} is missing: run ./scripts/build.sh first")
    cols = ["detect", "agree", "shrink", "agree+shrink", "from the last caller", "first all-reduce", "kill->done"]
    print(f"transport {args.transport}, {args.trials} trials per size, ms (p50 / p99 over every survivor)")
    print("| nodes | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for n in args.nodes:
        rows = []
        for t in range(args.trials):
            rows += trial(n, args.transport, victim=(t % (n - 1)) + 1 if t % 2 else 0)
        cells = [f"{statistics.median(r[c] for r in rows) / 1e6:.1f} / {pct([r[c] for r in rows], 0.99) / 1e6:.1f}"
                 for c in cols]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
