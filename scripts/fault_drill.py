#!/usr/bin/env python3
"""fault_drill.py — a training job killed or frozen at a random moment, restarted by
torchrun: does it end bit for bit where an uninterrupted job ends, and how soon?

    python3 scripts/fault_drill.py --backend ruccl --trials 30        # 30 trials of each fault kind
    python3 scripts/fault_drill.py --backend gloo --trials 30         # the comparison
    python3 scripts/fault_drill.py --table                            # the table of everything recorded

First it runs the example trainer (examples/collective_training.py train) once,
uninterrupted, under `torchrun --nproc-per-node 4 --max-restarts 3`, and records the
reference checksums and wall time (per layout).  Then each trial starts the same job
and, at a random moment of its training (uniform over --window of the reference's
training phase, below), injects one fault from outside, as a user's machine would:

    kill      SIGKILL of a random worker
    stop      SIGSTOP of a random worker (frozen: its sockets stay open)
    kill2     SIGKILL of a random worker in a two-agent layout: two torchrun node groups
              of 2 workers on 127.0.0.1 with c10d rendezvous; the fault is on the second
              group, so the first one's workers learn of it through the backend (or the
              rendezvous), not from their own agent

The training phase runs from rank 0's "train: training from step" (the group is formed
and the state restored) to its "train: finished" (the job's last collective, a barrier
after the final save, evaluation and plot).  Two other phases can be asked for, and are
reported apart, because no backend can cover them:

    --phase start-up   uniform over the reference's time to start training (importing
                       torch, forming the group): a worker frozen before it joined the
                       group is known to nobody and is found at the process group's timeout
    --phase exit       uniform over the reference's time from "finished" to the job's end:
                       a worker frozen after its last exchange has nobody left to notice
                       it; torchrun waits for it for ever (a hang on any backend)

A trial is recorded under the phase its fault landed in, whatever --phase asked for: a
job runs a little faster or slower than its reference, so a fault meant for the end of
the training can land after the last collective (rank 0 said "finished" in the first
run, or its survivors printed their checksums, before they exited).

A trial passes when every agent exits 0 and every rank prints the reference checksum.
It measures detection (from the fault until every other worker of the old group has
exited) and recovery (the job's wall time minus the reference's).  A job that has not
ended after 3 x the reference's wall time + the process group's timeout is a hang: it
is killed there and counted.  Every trial is appended to --json (default
docs/fault_drill.json), so a long drill can run in the background or across sessions;
the table is computed from everything the file holds.
"""
import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "collective_training.py")
KINDS = ("kill", "stop", "kill2")
PHASES = ("start-up", "training", "exit")
TRAINING = "train: training from step"  # rank 0's stderr: the group is formed, training begins
FINISHED = "train: finished"  # rank 0's stderr: the job's last collective (a barrier) is done
CHECKSUM = " final checksum: "  # every rank's stdout, after the last barrier


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """The pids of a process's children (torchrun's workers are its direct children)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def alive(pid):
    """Whether the process exists and has not exited (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Job:
    """One training job: one torchrun agent (layout 'one') or two (layout 'two')."""

    def __init__(self, args, layout, directory, env):
        self.started = time.monotonic()
        self.agents, self.logs = [], []
        common = [EXAMPLE, "train", directory, "--no-progress", "--backend", args.backend,
                  "--steps", str(args.steps), "--save-every", str(args.save_every), "--timeout", str(args.pg_timeout)]
        if layout == "one":
            cmds = [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                     "--max-restarts", "3"] + common]
        else:
            port = free_port()
            rdzv = ["--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"drill-{port}"]
            cmds = [[sys.executable, "-m", "torch.distributed.run"] + rdzv + common for _ in range(2)]
        for i, cmd in enumerate(cmds):
            out = open(os.path.join(directory + f".agent{i}.out"), "w+")
            err = open(os.path.join(directory + f".agent{i}.err"), "w+")
            self.logs.append((out, err))
            self.agents.append(subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT,
                                                start_new_session=True))
            if layout == "two" and i == 0:
                time.sleep(0.3)  # the first agent hosts the rendezvous store

    @staticmethod
    def _text(log):
        """What a log holds so far (the workers write to it beside this handle)."""
        log.flush()
        with open(log.name) as f:
            return f.read()

    def said(self, marker):
        """Whether rank 0 has written `marker` to its stderr yet."""
        return any(marker in self._text(err) for _, err in self.logs)

    def wait_marker(self, marker, deadline):
        """The monotonic time at which rank 0 said `marker` (polled every 10 ms), or None."""
        while time.monotonic() < deadline:
            if self.said(marker):
                return time.monotonic()
            if all(a.poll() is not None for a in self.agents):
                return None
            time.sleep(0.01)
        return None

    def workers(self, agent=None):
        agents = self.agents if agent is None else [self.agents[agent]]
        return [w for a in agents for w in children(a.pid) if alive(w)]

    def wait(self, deadline):
        """Waits for every agent until the monotonic deadline; True if all ended."""
        for a in self.agents:
            try:
                a.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def kill(self):
        for a in self.agents:
            for sig in (signal.SIGCONT, signal.SIGKILL):  # whole sessions: agents and workers
                try:
                    os.killpg(a.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                a.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def past_the_end(self):
        """Whether the run so far got past its last collective: rank 0 said "finished" or a
        rank printed its checksum (both come after the final barrier).  Asked once the old
        group's survivors have exited, it says whether a fault came after the victim had
        reached the job's last collective."""
        return self.said(FINISHED) or any(CHECKSUM in self._text(out) for out, _ in self.logs)

    def result(self):
        """(exit codes, the last checksum each rank printed, stderr tail)."""
        codes = [a.returncode for a in self.agents]
        sums, tail = {}, []
        for out, err in self.logs:
            out.seek(0)
            for line in out:
                parts = line.split()
                if len(parts) == 5 and parts[0] == "rank" and parts[2:4] == ["final", "checksum:"]:
                    sums[int(parts[1])] = parts[4]
            err.seek(0)
            tail += err.read().splitlines()[-5:]
            out.close()
            err.close()
        return codes, sums, tail


def run_reference(args, layout, workdir, env):
    directory = os.path.join(workdir, f"reference-{layout}")
    job = Job(args, layout, directory, env)
    ready = job.wait_marker(TRAINING, job.started + 600)
    finished = ready and job.wait_marker(FINISHED, job.started + 600)
    ok = finished is not None and job.wait(job.started + 600)
    wall = time.monotonic() - job.started
    if not ok:
        job.kill()
    codes, sums, tail = job.result()
    if not ok or any(codes) or len(sums) != 4 or len(set(sums.values())) != 1:
        sys.exit(f"fault_drill: the reference job ({layout}) failed: exit codes {codes}, checksums {sums}\n"
                 + "\n".join(tail))
    return {"layout": layout, "wall_s": wall, "start_s": ready - job.started, "train_s": finished - ready,
            "exit_s": job.started + wall - finished, "checksums": sums}


def trial(args, kind, index, ref, workdir, env, rng):
    layout = "two" if kind == "kill2" else "one"
    directory = os.path.join(workdir, f"{kind}-{index}")
    job = Job(args, layout, directory, env)
    lo, hi = args.window
    bound = job.started + 3 * ref["wall_s"] + args.pg_timeout
    if args.phase == "start-up":
        fault_at = job.started + rng.uniform(lo, hi) * ref["start_s"]
    elif args.phase == "training":
        fault_at = (job.wait_marker(TRAINING, bound) or time.monotonic()) + rng.uniform(lo, hi) * ref["train_s"]
    else:
        fault_at = (job.wait_marker(FINISHED, bound) or time.monotonic()) + rng.uniform(lo, hi) * ref["exit_s"]
    while time.monotonic() < fault_at:
        time.sleep(0.005)
    # the old group: the workers alive now (wait for them if the job is still starting)
    while True:
        group = job.workers()
        candidates = job.workers(1) if layout == "two" else group
        if candidates or time.monotonic() > job.started + 120:
            break
        time.sleep(0.005)
    record = {"backend": args.backend, "kind": kind, "phase": args.phase, "trial": index, "steps": args.steps,
              "save_every": args.save_every, "pg_timeout_s": args.pg_timeout,
              "fault_after_s": round(time.monotonic() - job.started, 3)}
    detection = None
    if candidates:
        victim = rng.choice(candidates)
        os.kill(victim, signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
        t_fault = time.monotonic()
        trained_at_fault = job.said(TRAINING)
        survivors = [w for w in group if w != victim]
        while any(alive(w) for w in survivors) and time.monotonic() < bound:
            time.sleep(0.005)
        if not any(alive(w) for w in survivors):
            detection = time.monotonic() - t_fault
        # where the fault landed, whatever was asked (the old group is gone: no restart has printed yet)
        record["phase"] = "exit" if job.past_the_end() else "training" if trained_at_fault else "start-up"
    ended = job.wait(bound)
    wall = time.monotonic() - job.started
    if not ended:
        job.kill()
    codes, sums, tail = job.result()
    record.update({
        "fault_injected": bool(candidates),
        "hang": not ended,
        "exit_codes": codes,
        "bit_identical": ended and not any(codes) and sums == ref["checksums"],
        "detection_s": None if detection is None else round(detection, 3),
        "wall_s": round(wall, 3),
        "recovery_s": round(wall - ref["wall_s"], 3) if ended else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    if not record["bit_identical"]:
        record["checksums"] = sums
        record["stderr_tail"] = tail[-6:]
    return record


def percentile(values, q):
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def table(records):
    rows = ["| backend | fault | trials | bit-identical | failed | hangs | detection p50 / p99 (s) | "
            "recovery p50 / p99 (s) |",
            "|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["backend"], r["kind"], r.get("phase", "training")) for r in records if "kind" in r},
                  key=lambda k: (k[0] != "ruccl", k[0], k[2] != "training", KINDS.index(k[1]) if k[1] in KINDS else 9))
    for backend, kind, phase in keys:
        rs = [r for r in records
              if r.get("backend") == backend and r.get("kind") == kind and r.get("phase", "training") == phase]
        kind = kind if phase == "training" else f"{kind} ({phase})"
        det = [r["detection_s"] for r in rs if r.get("detection_s") is not None]
        rec = [r["recovery_s"] for r in rs if r["bit_identical"]]  # a failed job recovered nothing
        fmt = lambda v: f"{percentile(v, 50):.2f} / {percentile(v, 99):.2f}" if v else "-"  # noqa: E731
        undetected = len(rs) - len(det)
        failed = sum(not r["hang"] and not r["bit_identical"] for r in rs)
        rows.append(f"| {backend} | {kind} | {len(rs)} | {sum(bool(r['bit_identical']) for r in rs)} | {failed} | "
                    f"{sum(bool(r['hang']) for r in rs)} | {fmt(det)}{f' ({undetected} never)' if undetected else ''} | "
                    f"{fmt(rec)} |")
    return "\n".join(rows)


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"trials": [], "references": []}


def save(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["ruccl", "gloo"], default="ruccl")
    p.add_argument("--trials", type=int, default=3, help="trials of each fault kind (default 3)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"fault kinds, of {','.join(KINDS)}")
    p.add_argument("--steps", type=int, default=400, help="the job's steps (default 400)")
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--pg-timeout", type=float, default=60.0,
                   help="the process group's timeout on either backend, seconds (default 60)")
    p.add_argument("--phase", choices=PHASES, default="training",
                   help="where the fault falls: in the job's start, its training (default: from the group's "
                        "forming to its last collective) or its exit")
    p.add_argument("--window", type=float, nargs=2, default=(0.0, 1.0), metavar=("LO", "HI"),
                   help="the fault comes at uniform(LO, HI) x the reference's time of that phase into it")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", default=os.path.join(ROOT, "docs", "fault_drill.json"))
    p.add_argument("--workdir", default=None, help="where the jobs' directories go (default: a fresh temporary one)")
    p.add_argument("--table", action="store_true", help="print the table of what --json holds, and run nothing")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            p.error(f"unknown fault kind {k!r} (kinds: {', '.join(KINDS)})")
    if args.table:
        print(table(load(args.json)["trials"]))
        return 0
    import tempfile

    workdir = args.workdir or tempfile.mkdtemp(prefix="fault-drill-")
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("RUCCL_SECRET", os.urandom(16).hex())
    env.pop("RUCCL_FAULT", None)
    rng = random.Random(args.seed)
    refs = {}
    for layout in sorted({"two" if k == "kill2" else "one" for k in kinds}):
        refs[layout] = run_reference(args, layout, workdir, env)
        print(f"reference ({args.backend}, {layout} agent{'s' if layout == 'two' else ''}): "
              f"{refs[layout]['wall_s']:.1f} s ({refs[layout]['start_s']:.1f} s to start training), checksum {next(iter(refs[layout]['checksums'].values()))[:16]}...",
              flush=True)
    if "one" in refs and "two" in refs and refs["one"]["checksums"] != refs["two"]["checksums"]:
        sys.exit("fault_drill: the one-agent and two-agent references end with different checksums")
    data = load(args.json)
    for ref in refs.values():
        data["references"].append({"backend": args.backend, "steps": args.steps, **ref,
                                   "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    save(args.json, data)
    mine = []
    for i in range(args.trials):
        for kind in kinds:
            ref = refs["two" if kind == "kill2" else "one"]
            r = trial(args, kind, i, ref, workdir, env, rng)
            mine.append(r)
            data = load(args.json)
            data["trials"].append(r)
            save(args.json, data)
            det = "never" if r["detection_s"] is None else f"{r['detection_s']:.2f} s"
            print(f"{args.backend} {kind} #{i}: fault at {r['fault_after_s']:.1f} s, detection {det}, "
                  f"wall {r['wall_s']:.1f} s, {'HANG, ' if r['hang'] else ''}"
                  f"{'bit-identical' if r['bit_identical'] else 'NOT bit-identical: ' + str(r.get('exit_codes'))}",
                  flush=True)
    print("\nthis run:\n" + table(mine))
    print(f"\neverything in {args.json}:\n" + table(data["trials"]))
    return 0 if all(r["bit_identical"] and not r["hang"] for r in mine) else 1


if __name__ == "__main__":
    sys.exit(main())
