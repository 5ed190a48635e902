#!/usr/bin/env python3
"""torch_bench.py -- torch.distributed collectives, several backends side by side.

Runs the same sweep (collectives x message sizes, float32, CPU tensors) on each backend in
turn and prints an nccl-tests-style table per collective with the backends next to each
other, a speedup column, a "targets" summary for ruccl against gloo, and optionally a PNG
plot and a JSON dump of the raw results.

Usage (from the repository root)::

    python3 bench/torch_bench.py                                  # ruccl vs gloo, 2 ranks, 8 B..64 MB
    python3 bench/torch_bench.py --backends gloo --max-bytes 64K  # gloo only, quick
    python3 bench/torch_bench.py --backends gloo,gloo             # same backend twice (labels gloo, gloo#2)
    python3 bench/torch_bench.py --backends ruccl,ruccl:RUCCL_TRACE_BUFFER=0 --ops all_reduce --max-bytes 4K
                                             # a backend with environment variables of its own: here the
                                             # flight recorder on (its default) and off, side by side
    python3 bench/torch_bench.py --nproc 4 --ops all_reduce --step-factor 4 --json out.json

Processes.  For each backend, ``--nproc`` processes are started with
``torch.multiprocessing`` (spawn); each one calls ``init_process_group(backend,
init_method="tcp://127.0.0.1:<free port>")`` (a new port per backend), runs the whole
sweep and calls ``destroy_process_group``.  Backends run one after the other, never at the
same time.  A worker whose backend is ``ruccl`` does ``import ruccl_pg`` first (the
repository root is put on ``sys.path``).  Each worker also opens a side process group on
gloo, used only for the barrier before each timed loop and for combining the measurements
of the ranks, so those never depend on the backend under test.

Measurement, for each (backend, collective, size):
  1. a check iteration on a known pattern, verified on every rank (all_reduce: rank r sends
     ramp + r, expects n*ramp + n(n-1)/2; broadcast from rank 0: the ramp; all_gather:
     rank r sends ramp + 100*r, chunk j of the output must be ramp + 100*j; ramp = i mod 97);
  2. warmup iterations (at most ``--warmup``, fewer when one operation is slow);
  3. barrier (gloo side group), then ``iters`` back-to-back operations timed together
     (``async_op=False``); time per operation = elapsed / iters (the mean; each
     operation's own lap is also stamped, for ``--stat median``).  ``iters`` is chosen from
     the warmup (its median lap) so that the timed loop lasts about ``--point-time`` seconds, clamped to
     [``--min-iters``, ``--max-iters``]; every rank uses the same counts;
  4. another check iteration as in 1.
  The reported time is the maximum over ranks of the per-rank mean (or median).  Elements that
  fail a check are counted over ranks (#wrong); a point with #wrong > 0 is shown as
  "WRONG" and makes the exit status 1.  The targets are reporting only: they never
  change the exit status.

Conventions (those of nccl-tests):
  size   all_reduce, broadcast: bytes of each rank's buffer.
         all_gather: bytes of the gathered output (per-rank input bytes * n); per-rank
         count = floor(size / 4 / n) elements, and size is rounded down to a multiple of
         4*n bytes (sizes that round to the same value are run once).
  count  elements per rank's buffer (all_gather: the per-rank input count).
  time   microseconds per operation (max over ranks).
  algbw  size / time, in GB/s (1 GB = 1e9 B).
  busbw  algbw * factor: all_reduce 2(n-1)/n, all_gather (n-1)/n, broadcast 1.
  speedup  time(baseline) / time(candidate), equal to busbw(candidate) / busbw(baseline)
         (same size, same factor).  Candidate = the first backend named ruccl (else the
         first listed), baseline = the first other backend named gloo (else the next one
         listed); ``--compare CAND,BASE`` names them by label.  "-" where either is missing.
Targets (all_reduce, candidate vs baseline):
  latency   time(cand)/time(base) <= 0.1 for 8 B .. 4 KB;
  bandwidth busbw(cand)/busbw(base) >= 3 for 1 MB .. 64 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
import tempfile
import time
import traceback

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("all_reduce", "broadcast", "all_gather")
DTYPE_BYTES = 4  # float32
LAT_TARGET = (8, 4 << 10, 0.1)  # all_reduce sizes [lo, hi], time ratio cand/base <= 0.1
BW_TARGET = (1 << 20, 64 << 20, 3.0)  # all_reduce sizes [lo, hi], busbw ratio cand/base >= 3


# ---------------------------------------------------------------------------------------
# helpers shared by parent and workers
# ---------------------------------------------------------------------------------------
def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op == "all_gather":
        return (n - 1) / n
    return 1.0


def point_shape(op: str, size: int, n: int):
    """(size in bytes as reported, per-rank count) for a requested size, or None if too small."""
    if op == "all_gather":
        count = size // DTYPE_BYTES // n
        return (count * DTYPE_BYTES * n, count) if count > 0 else None
    count = size // DTYPE_BYTES
    return (count * DTYPE_BYTES, count) if count > 0 else None


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    value = int(float(t) * mult)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0: {text!r}")
    return value


def human(nbytes: int) -> str:
    for unit, m in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= m and nbytes % m == 0:
            return f"{nbytes // m} {unit}"
    return f"{nbytes} B"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------
# worker
# ---------------------------------------------------------------------------------------
def _worker(rank: int, cfg: dict) -> None:
    try:
        _worker_main(rank, cfg)
    except BaseException:
        with open(os.path.join(cfg["tmpdir"], f"error.{rank}"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _worker_main(rank: int, cfg: dict) -> None:
    backend, n = cfg["backend"], cfg["nproc"]
    os.environ.update(cfg["env"])  # the backend spec's variables, before the backend is imported
    if backend == "ruccl":
        if REPO_ROOT not in sys.path:
            sys.path.insert(0, REPO_ROOT)
        import ruccl_pg  # noqa: F401  (registers the "ruccl" backend)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg["threads"])
    dist.init_process_group(backend, init_method=cfg["init_method"], rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=cfg["timeout"]))
    side = dist.new_group(backend="gloo")  # barrier + combining measurements only
    out = open(os.path.join(cfg["tmpdir"], "results.jsonl"), "a") if rank == 0 else None
    f32 = torch.float32
    # all_gather_into_tensor is deprecated (a FutureWarning) in favour of all_gather_single
    ag_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def agree_max(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=side)
        return t.tolist()

    def agree_sum(values):
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=side)
        return t.tolist()

    def gather_times(*xs):
        t = torch.tensor(xs, dtype=torch.float64)
        lst = [torch.zeros(len(xs), dtype=torch.float64) for _ in range(n)]
        dist.all_gather(lst, t, group=side)
        return [v.tolist() for v in lst]  # [rank][i]

    try:
        for op in cfg["ops"]:
            t_op = time.perf_counter()
            seen = set()
            for req in cfg["sizes"]:
                shape = point_shape(op, req, n)
                if shape is None or shape in seen:
                    continue
                seen.add(shape)
                size, count = shape
                ramp = torch.arange(count, dtype=f32).remainder_(97.0)

                if op == "all_reduce":
                    buf = torch.empty(count, dtype=f32)
                    expected = ramp * n + n * (n - 1) / 2

                    def fill():
                        torch.add(ramp, float(rank), out=buf)

                    def run():
                        dist.all_reduce(buf)

                    def wrong():
                        return int((buf != expected).sum().item())
                elif op == "broadcast":
                    buf = torch.empty(count, dtype=f32)
                    expected = ramp

                    def fill():
                        if rank == 0:
                            buf.copy_(ramp)
                        else:
                            buf.fill_(-1.0)

                    def run():
                        dist.broadcast(buf, src=0)

                    def wrong():
                        return int((buf != expected).sum().item())
                else:  # all_gather
                    inp = torch.empty(count, dtype=f32)
                    outbuf = torch.empty(count * n, dtype=f32)
                    chunks = list(outbuf.chunk(n))
                    expected = torch.cat([ramp + 100.0 * j for j in range(n)])

                    def fill():
                        torch.add(ramp, 100.0 * rank, out=inp)
                        outbuf.fill_(-1.0)

                    if cfg["all_gather_api"] == "list":
                        def run():
                            dist.all_gather(chunks, inp)
                    else:
                        def run():
                            ag_single(outbuf, inp)

                    def wrong():
                        return int((outbuf != expected).sum().item())

                # 1. check iteration (also a first estimate of the time of one operation)
                fill()
                dist.barrier(group=side)
                t0 = time.perf_counter()
                run()
                t_first = time.perf_counter() - t0
                bad = wrong()
                (t_first,) = agree_max([t_first])

                # 2. warmup
                nwarm = cfg["warmup"]
                if nwarm > 0:
                    nwarm = max(1, min(nwarm, math.ceil(0.25 * cfg["point_time"] / max(t_first, 1e-7))))
                    laps = []
                    dist.barrier(group=side)
                    for _ in range(nwarm):
                        t0 = time.perf_counter()
                        run()
                        laps.append(time.perf_counter() - t0)
                    # median lap: one scheduler hiccup in the warmup must not shrink iters
                    (t_est,) = agree_max([sorted(laps)[nwarm // 2]])
                else:
                    t_est = t_first
                iters = int(round(cfg["point_time"] / max(t_est, 1e-7)))
                iters = max(cfg["min_iters"], min(cfg["max_iters"], iters))

                # 3. timed loop
                stamps = [0.0] * iters
                clock = time.perf_counter
                dist.barrier(group=side)
                t0 = clock()
                for i in range(iters):
                    run()
                    stamps[i] = clock()
                per_op = (stamps[-1] - t0) / iters
                laps = sorted(b - a for a, b in zip([t0] + stamps[:-1], stamps))
                median = laps[iters // 2] if iters % 2 else 0.5 * (laps[iters // 2 - 1] + laps[iters // 2])

                # 4. second check
                fill()
                run()
                bad += wrong()

                times = gather_times(per_op, median)
                (bad,) = agree_sum([bad])
                if rank == 0:
                    mean_max = max(t[0] for t in times)
                    median_max = max(t[1] for t in times)
                    t_max = median_max if cfg["stat"] == "median" else mean_max
                    algbw = size / t_max / 1e9
                    rec = dict(backend=backend, op=op, size=size, count=count, nranks=n,
                               stat=cfg["stat"], time_us=t_max * 1e6,
                               mean_us=mean_max * 1e6, median_us=median_max * 1e6,
                               mean_us_ranks=[t[0] * 1e6 for t in times],
                               median_us_ranks=[t[1] * 1e6 for t in times],
                               algbw=algbw, busbw=algbw * bus_factor(op, n), iters=iters,
                               warmup=nwarm, first_us=t_first * 1e6, wrong=int(bad))
                    out.write(json.dumps(rec) + "\n")
                    out.flush()
                    if cfg["verbose"]:
                        print(f"  [{cfg['label']}] {op:<10} {size:>11} B  {t_max * 1e6:12.1f} us"
                              f"  iters {iters:4d}  warmup {nwarm}" + (f"  WRONG {bad}" if bad else ""),
                              file=sys.stderr, flush=True)
                del ramp, expected
            if rank == 0:
                print(f"  [{cfg['label']}] {op}: {time.perf_counter() - t_op:.1f} s",
                      file=sys.stderr, flush=True)
        dist.barrier(group=side)
    finally:
        if out is not None:
            out.close()
        if dist.is_initialized():
            dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# parent: run one backend
# ---------------------------------------------------------------------------------------
def run_backend(label: str, backend: str, args, sizes, env: dict) -> tuple[list, str | None]:
    """Run the sweep on one backend; returns (records, error message or None)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="torch_bench.") as tmpdir:
        cfg = dict(backend=backend, label=label, env=env, nproc=args.nproc, ops=args.ops, sizes=sizes,
                   init_method=f"tcp://127.0.0.1:{free_port()}", tmpdir=tmpdir,
                   timeout=args.timeout, threads=args.threads, warmup=args.warmup,
                   min_iters=args.min_iters, max_iters=args.max_iters,
                   point_time=args.point_time, all_gather_api=args.all_gather_api,
                   stat=args.stat,
                   verbose=args.verbose)
        error = None
        ctx = mp.start_processes(_worker, args=(cfg,), nprocs=args.nproc, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + args.timeout
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    error = f"timed out after {args.timeout} s"
                    break
        except Exception as e:  # a worker raised or died
            error = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
        if error is not None:
            details = []
            for r in range(args.nproc):
                path = os.path.join(tmpdir, f"error.{r}")
                if os.path.exists(path):
                    with open(path) as f:
                        lines = f.read().strip().splitlines()
                    details.append(f"rank {r}: {lines[-1] if lines else '?'}")
            if details:
                error = "; ".join(details[:2])
        records = []
        path = os.path.join(tmpdir, "results.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        rec = json.loads(line)
                        rec["label"] = label
                        records.append(rec)
        return records, error


# ---------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------
def pick_compare(labels: list[str], backends: dict[str, str], spec: str | None):
    if spec:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 2 or any(p not in labels for p in parts) or parts[0] == parts[1]:
            raise SystemExit(f"--compare wants two different labels among {labels}, got {spec!r}")
        return parts[0], parts[1]
    if len(labels) < 2:
        return None, None
    cand = next((lb for lb in labels if backends[lb] == "ruccl"), labels[0])
    others = [lb for lb in labels if lb != cand]
    base = next((lb for lb in others if backends[lb] == "gloo"), others[0])
    return cand, base


def fmt_num(x: float | None, width: int) -> str:
    if x is None:
        return f"{'-':>{width}}"
    if x >= 1e5:
        return f"{x:{width}.0f}"
    if x >= 100:
        return f"{x:{width}.1f}"
    return f"{x:{width}.2f}"


def print_tables(results: dict, labels: list[str], cand, base, args, errors) -> None:
    n = args.nproc
    for op in args.ops:
        rows = sorted({(r["size"], r["count"]) for lb in labels for r in results[lb].values()
                       if r["op"] == op})
        factor = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "broadcast": "1"}[op]
        what = ("bytes of the gathered output" if op == "all_gather" else "bytes per rank buffer")
        extra = ", sum" if op == "all_reduce" else (", root 0" if op == "broadcast" else "")
        print()
        print(f"# {op}  float32{extra}, {n} ranks   (size = {what}; busbw = algbw * {factor})")
        col = 30
        head1 = f"# {'':>10}  {'':>10} "
        head2 = f"# {'size':>10}  {'count':>10} "
        head3 = f"# {'(B)':>10}  {'(elements)':>10} "
        for lb in labels:
            head1 += f" {lb + (' (FAILED)' if lb in errors else ''):^{col}}"
            head2 += f" {'time':>10} {'algbw':>9} {'busbw':>9}"
            head3 += f" {'(us)':>10} {'(GB/s)':>9} {'(GB/s)':>9}"
        if cand:
            head1 += f"  {'speedup':>12}"
            head2 += f"  {base + '/' + cand:>12}" if len(base + cand) < 12 else f"  {'t_b/t_c':>12}"
            head3 += f"  {'(x)':>12}"
        print(head1.rstrip())
        print(head2)
        print(head3)
        for size, count in rows:
            line = f"  {size:>10}  {count:>10} "
            for lb in labels:
                r = results[lb].get((op, size))
                if r is None:
                    line += f" {'-':>10} {'-':>9} {'-':>9}"
                elif r["wrong"]:
                    line += f" {'WRONG':>10} {r['wrong']:>9} {'elts':>9}"
                else:
                    line += f" {fmt_num(r['time_us'], 10)} {fmt_num(r['algbw'], 9)} {fmt_num(r['busbw'], 9)}"
            if cand:
                s = speedup(results, cand, base, op, size)
                line += f"  {fmt_num(s, 12)}"
            print(line)


def speedup(results, cand, base, op, size):
    rc, rb = results[cand].get((op, size)), results[base].get((op, size))
    if not rc or not rb or rc["wrong"] or rb["wrong"] or rc["time_us"] <= 0:
        return None
    return rb["time_us"] / rc["time_us"]


def print_targets(results, labels, cand, base, args) -> None:
    print()
    print("# targets (reporting only; the exit status does not depend on them)")
    if "all_reduce" not in args.ops:
        print("#   not evaluated: all_reduce was not run")
        return
    if not cand:
        print("#   not evaluated: needs two backends (candidate and baseline)")
        return
    print(f"#   candidate {cand}, baseline {base}, all_reduce, {args.nproc} ranks")
    sizes = sorted({s for lb in labels for (op, s) in results[lb] if op == "all_reduce"})
    summary = []
    for name, (lo, hi, thr), what, cmp in (
            ("latency", LAT_TARGET, f"time({cand})/time({base})", "<="),
            ("bandwidth", BW_TARGET, f"busbw({cand})/busbw({base})", ">=")):
        print(f"#   {name}: {what} {cmp} {thr:g} for {human(lo)} .. {human(hi)}")
        in_range = [s for s in sizes if lo <= s <= hi]
        if not in_range:
            print("#     (no size of this run falls in the range)")
            continue
        met = 0
        for s in in_range:
            sp = speedup(results, cand, base, "all_reduce", s)
            if sp is None:
                print(f"#     {human(s):>8}  {'-':>8}  n/a (missing or wrong result)")
                continue
            ratio = 1.0 / sp if name == "latency" else sp
            ok = ratio <= thr if name == "latency" else ratio >= thr
            met += ok
            print(f"#     {human(s):>8}  {ratio:8.3f}  {'met' if ok else 'NOT met'}")
        na = sum(1 for s in in_range if speedup(results, cand, base, "all_reduce", s) is None)
        summary.append(f"{name} {met}/{len(in_range)} met" + (f" ({na} n/a)" if na else ""))
    if summary:
        print("#   summary: " + ", ".join(summary))


def save_plot(results, labels, args) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"# plot skipped: matplotlib is not installed (pip install matplotlib)")
        return
    ops = [op for op in args.ops if any(k[0] == op for lb in labels for k in results[lb])]
    if not ops:
        print("# plot skipped: no results")
        return
    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 4 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        ax_bw, ax_t = axes[i]
        for lb in labels:
            pts = sorted((s, r) for (o, s), r in results[lb].items() if o == op and not r["wrong"])
            if not pts:
                continue
            xs = [s for s, _ in pts]
            ax_bw.plot(xs, [max(r["busbw"], 1e-9) for _, r in pts], marker="o", ms=3, label=lb)
            ax_t.plot(xs, [r["time_us"] for _, r in pts], marker="o", ms=3, label=lb)
        for ax, ylab, title in ((ax_bw, "busbw (GB/s)", "bus bandwidth"),
                                (ax_t, "time per op (us)", "latency")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("size (B)")
            ax.set_ylabel(ylab)
            ax.set_title(f"{op}: {title} ({args.nproc} ranks, float32)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)
    print(f"# plot saved to {args.plot}")


# ---------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__[__doc__.index("Conventions"):],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="ruccl,gloo",
                    help="comma list, run in this order (default ruccl,gloo); a repeated "
                         "backend gets labels name#2, name#3, ...; NAME:VAR=VALUE[:VAR=VALUE] runs "
                         "NAME with those environment variables (the label is the whole spec)")
    ap.add_argument("--nproc", type=int, default=2, help="processes (ranks), default 2")
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma list among {','.join(OPS)}")
    ap.add_argument("--min-bytes", "-b", type=parse_size, default=8,
                    help="smallest size, e.g. 8, 4K, 1M (K/M/G = 2^10/2^20/2^30); default 8")
    ap.add_argument("--max-bytes", "-e", type=parse_size, default=64 << 20,
                    help="largest size; default 64M")
    ap.add_argument("--step-factor", "-f", type=int, default=2,
                    help="size multiplier between points (2 or 4 ...); default 2")
    ap.add_argument("--warmup", "-w", type=int, default=5,
                    help="warmup iterations at most (fewer for slow points); default 5")
    ap.add_argument("--min-iters", type=int, default=3, help="timed iterations at least; default 3")
    ap.add_argument("--max-iters", type=int, default=1000, help="timed iterations at most; default 1000")
    ap.add_argument("--point-time", type=float, default=0.25,
                    help="target seconds of the timed loop of one point; default 0.25")
    ap.add_argument("--stat", choices=("mean", "median"), default="mean",
                    help="time reported: mean (default, as nccl-tests: timed loop / iters) or "
                         "median of the per-operation laps; both go to --json")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in workers; default 1")
    ap.add_argument("--all-gather-api", choices=("tensor", "list"), default="tensor",
                    help="one output tensor (default, as nccl-tests: all_gather_single, or "
                         "all_gather_into_tensor on older torch) or list all_gather")
    ap.add_argument("--compare", metavar="CAND,BASE", help="labels for the speedup column and targets")
    ap.add_argument("--timeout", type=int, default=300,
                    help="seconds allowed for one backend's whole sweep (also the process "
                         "group timeout); default 300")
    ap.add_argument("--plot", default=os.path.join(REPO_ROOT, "bench", "torch_bench.png"),
                    help="PNG path (default bench/torch_bench.png); 'none' to skip")
    ap.add_argument("--json", metavar="PATH", help="dump raw results to PATH")
    ap.add_argument("--verbose", "-v", action="store_true", help="one line per point on stderr")
    args = ap.parse_args()

    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad_ops = [o for o in args.ops if o not in OPS]
    if bad_ops or not args.ops:
        ap.error(f"unknown op(s) {bad_ops}; choose among {OPS}")
    if args.nproc < 2:
        ap.error("--nproc must be >= 2")
    if args.step_factor < 2:
        ap.error("--step-factor must be >= 2")
    if args.min_bytes > args.max_bytes:
        ap.error("--min-bytes > --max-bytes")
    if args.min_iters < 1 or args.max_iters < args.min_iters:
        ap.error("need 1 <= --min-iters <= --max-iters")
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not names:
        ap.error("--backends is empty")
    labels, backends, envs = [], {}, {}
    for spec in names:
        b, *assignments = spec.split(":")
        env = {}
        for a in assignments:
            if "=" not in a:
                ap.error(f"--backends: {spec!r}: {a!r} is not VAR=VALUE")
            var, value = a.split("=", 1)
            env[var] = value
        k = sum(1 for x in labels if x == spec or x.startswith(spec + "#"))
        lb = spec if k == 0 else f"{spec}#{k + 1}"
        labels.append(lb)
        backends[lb] = b
        envs[lb] = env
    cand, base = pick_compare(labels, backends, args.compare)

    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.step_factor

    import torch
    print(f"# torch_bench: torch {torch.__version__}, {platform.node()}, {os.cpu_count()} cpus, "
          f"{args.nproc} ranks, float32 (CPU tensors), ops {','.join(args.ops)}")
    print(f"# sizes {args.min_bytes} .. {args.max_bytes} B x{args.step_factor}, warmup <= {args.warmup}, "
          f"iters {args.min_iters}..{args.max_iters} (~{args.point_time:g} s per point), "
          f"worker threads {args.threads}, time = max over ranks of the {args.stat} per op")
    print(f"# backends {', '.join(labels)}" + (f"; speedup = time({base})/time({cand})" if cand else ""))
    sys.stdout.flush()

    results, errors, runtimes, raw = {}, {}, {}, []
    t_all = time.perf_counter()
    for lb in labels:
        print(f"# running {lb} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        recs, err = run_backend(lb, backends[lb], args, sizes, envs[lb])
        runtimes[lb] = time.perf_counter() - t0
        results[lb] = {(r["op"], r["size"]): r for r in recs}
        raw.extend(recs)
        if err:
            errors[lb] = err
            print(f"# {lb}: FAILED ({err})", file=sys.stderr, flush=True)
        print(f"# {lb}: {runtimes[lb]:.1f} s", file=sys.stderr, flush=True)

    print_tables(results, labels, cand, base, args, errors)
    print_targets(results, labels, cand, base, args)
    print()
    wrong = [(r["label"], r["op"], r["size"], r["wrong"]) for r in raw if r["wrong"]]
    for lb, op, size, w in wrong:
        print(f"# WRONG: {lb} {op} {size} B: {w} elements differ from the expected result")
    for lb, err in errors.items():
        print(f"# FAILED: {lb}: {err}")
    print("# runtime: " + ", ".join(f"{lb} {runtimes[lb]:.1f} s" for lb in labels)
          + f", total {time.perf_counter() - t_all:.1f} s")

    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, host=platform.node(), nproc=args.nproc,
                           backends={lb: backends[lb] for lb in labels}, compare=[cand, base],
                           args={k: v for k, v in vars(args).items()}, errors=errors,
                           runtimes_s=runtimes, results=raw), f, indent=1)
        print(f"# json saved to {args.json}")
    if args.plot and args.plot.lower() != "none":
        save_plot(results, labels, args)
    return 1 if (errors or wrong) else 0


if __name__ == "__main__":
    sys.exit(main())
