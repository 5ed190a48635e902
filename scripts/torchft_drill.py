#!/usr/bin/env python3
"""torchft_drill.py — kill -9 a replica group of a torchft job mid-training, on ruccl or gloo.

Two replica groups (processes, examples/torchft_training.py) train under torchft's
Manager with a lighthouse from torchft's wheel (started here, in-process).  Once both
commit steps together, replica 1 gets SIGKILL and is restarted at once (as a job
scheduler would); replica 0 keeps stepping, the new replica 1 heals from it and
rejoins.  Per trial:
  lost      replica 0's steps not committed after the kill
  to-next   seconds from the kill to replica 0's next committed step
  heal      seconds from the restart to the new replica 1 holding the healed weights
  rejoin    seconds from the restart to its first step committed with both groups
  same      both groups end with the same weights (sha256 of every parameter)

    python3 scripts/torchft_drill.py --backend ruccl gloo --trials 5 --steps 150
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from torchft.coordination import LighthouseServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "torchft_training.py")


def start(replica, backend, lighthouse, steps, out, log):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, EXAMPLE, "--replica", str(replica), "--lighthouse", lighthouse,
                             "--steps", str(steps), "--backend", backend, "--out", out],
                            env=env, stdout=open(log, "w"), stderr=open(log + ".err", "w"))


def lines(path):
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def trial(backend, steps, kill_at, bound):
    lh = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=500, quorum_tick_ms=50,
                          heartbeat_timeout_ms=1000)
    d = tempfile.mkdtemp(prefix="tft-drill-")
    logs = [os.path.join(d, "r0.log"), os.path.join(d, "r1.log"), os.path.join(d, "r1b.log")]
    procs = [start(0, backend, lh.address(), steps, d, logs[0]), start(1, backend, lh.address(), steps, d, logs[1])]
    try:
        deadline = time.time() + bound
        while time.time() < deadline:
            ok = [l for l in lines(logs[1]) if l.get("committed") and l.get("participants") == 2]
            if ok and ok[-1]["step"] >= kill_at:
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("the two groups never stepped together")
        killed = time.time()
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        restarted = time.time()
        procs.append(start(1, backend, lh.address(), steps, d, logs[2]))
        hung = False
        for p in (procs[0], procs[2]):
            try:
                p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                hung = True
        r0 = [l for l in lines(logs[0]) if "step" in l and "t" in l]
        r1 = [l for l in lines(logs[2]) if "step" in l and "t" in l]
        after = [l for l in r0 if l["t"] > killed]
        lost = 0
        for l in after:
            if l["committed"]:
                break
            lost += 1
        first = next((l for l in after if l["committed"]), None)
        healed = next((l["healed"] for l in r1 if l.get("healed")), None)
        rejoined = next((l for l in r1 if l["committed"] and l["participants"] == 2), None)
        results = []
        for name in ("replica0.json", "replica1.json"):
            try:
                with open(os.path.join(d, name)) as f:
                    results.append(json.load(f))
            except OSError:
                results.append(None)
        same = all(results) and results[0]["digest"] == results[1]["digest"] and \
            results[0]["step"] == results[1]["step"] == steps
        return {"hung": hung, "lost": lost, "to_next": first["t"] - killed if first else None,
                "heal": healed - restarted if healed else None,
                "rejoin": rejoined["t"] - restarted if rejoined else None, "same": bool(same)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        lh.shutdown()


def cell(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{statistics.median(xs):.2f} / {max(xs):.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", nargs="+", default=["ruccl", "gloo"])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kill-at", type=int, default=40)
    ap.add_argument("--bound", type=float, default=240.0, help="seconds a trial may take")
    args = ap.parse_args()
    print(f"{args.trials} trials per backend, {args.steps} steps, kill -9 of replica 1 at step {args.kill_at}; "
          "seconds, median / max")
    print("| backend | trials | same weights | hung | steps lost (median / max) | kill to next commit | heal | rejoin |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in args.backend:
        rows = []
        for _ in range(args.trials):
            rows.append(trial(backend, args.steps, args.kill_at, args.bound))
            print(f"  {backend}: {rows[-1]}", file=sys.stderr, flush=True)
        lost = [r["lost"] for r in rows if not r["hung"]]
        print(f"| {backend} | {len(rows)} | {sum(r['same'] for r in rows)} | {sum(r['hung'] for r in rows)} | "
              f"{statistics.median(lost) if lost else '-'} / {max(lost) if lost else '-'} | "
              f"{cell(r['to_next'] for r in rows)} | {cell(r['heal'] for r in rows)} | "
              f"{cell(r['rejoin'] for r in rows)} |", flush=True)


if __name__ == "__main__":
    main()
