#!/usr/bin/env python3
"""ddp_bench.py -- the communication overhead of a DDP training step, backends side by side.

    python3 bench/ddp_bench.py                         # 4 ranks: ruccl, gloo, noop
    python3 bench/ddp_bench.py --nproc 8 --iters 100 --backends ruccl,gloo,ruccl

Each backend in turn: --nproc processes (spawn), one thread each (torch.set_num_threads(1)),
init_process_group(backend) on a fresh tcp:// port, a model of --layers x Linear(--width,
--width) with ReLU between, wrapped in DistributedDataParallel (default buckets), a batch of
--batch random rows, SGD.  Two loops of --iters timed steps (after --warmup), alternating
in blocks of 10 so that both see the same machine:

  step      zero_grad, forward, backward (DDP all-reduces the gradients), optimizer.step
  compute   the same inside ddp.no_sync(): no communication at all

A backend named "noop" is DDP over gloo with a communication hook that sends nothing:
its overhead is DDP's own bookkeeping (the gradients copied into buckets and back),
the floor under every backend's.

Every step starts together on all ranks (a barrier on a side gloo group, outside the
timing).  Reported: the median over steps of the slowest rank's time, and
overhead = step - compute, the price of the communication the backward pass did not hide.
Target (issue 12): ruccl's overhead at most half of gloo's at 4 ranks.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, cfg: dict, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend, n = cfg["backend"], cfg["nproc"]
    noop = backend == "noop"  # DDP's own bookkeeping: gloo underneath, a hook that sends nothing
    if noop:
        backend = "gloo"
    if backend == "ruccl":
        sys.path.insert(0, REPO_ROOT)
        import ruccl_pg  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=n)
    side = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    layers = []
    for _ in range(cfg["layers"]):
        layers += [torch.nn.Linear(cfg["width"], cfg["width"]), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    if noop:

        def no_communication(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        model.register_comm_hook(None, no_communication)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(cfg["batch"], cfg["width"], generator=torch.Generator().manual_seed(rank))

    def step(sync: bool) -> float:
        dist.barrier(group=side)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        if sync:
            model(x).square().mean().backward()
        else:
            with model.no_sync():
                model(x).square().mean().backward()
        opt.step()
        return time.perf_counter() - t0

    for _ in range(cfg["warmup"]):
        step(True)
        step(False)
    laps = {True: [], False: []}
    done = 0
    while done < cfg["iters"]:
        block = min(10, cfg["iters"] - done)
        for sync in (True, False):
            laps[sync] += [step(sync) for _ in range(block)]
        done += block
    # the slowest rank's lap, step by step
    t = torch.tensor([laps[True], laps[False]], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=side)
    if rank == 0:
        out.put((statistics.median(t[0].tolist()), statistics.median(t[1].tolist())))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--backends", default="ruccl,gloo,noop")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    rows = []
    for backend in args.backends.split(","):
        cfg = dict(vars(args), backend=backend, port=free_port())
        out = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, cfg, out)) for r in range(args.nproc)]
        for p in procs:
            p.start()
        step, compute = out.get(timeout=600)
        for p in procs:
            p.join(60)
            if p.exitcode != 0:
                print(f"ddp_bench: a {backend} rank exited with {p.exitcode}", file=sys.stderr)
                return 1
        rows.append((backend, step, compute))
    print(f"# DDP step: {args.layers} x Linear({args.width}, {args.width}), batch {args.batch}, "
          f"{args.nproc} ranks, 1 thread each, {os.cpu_count()} cores; median of {args.iters} steps (slowest rank)")
    print(f"{'backend':>10} {'step ms':>10} {'compute ms':>11} {'overhead ms':>12}")
    for backend, step, compute in rows:
        print(f"{backend:>10} {step * 1e3:10.2f} {compute * 1e3:11.2f} {(step - compute) * 1e3:12.2f}")
    over = {b: s - c for b, s, c in rows}
    if "ruccl" in over and "gloo" in over and over["gloo"] > 0:
        ratio = over["ruccl"] / over["gloo"]
        print(f"# overhead ruccl / gloo = {ratio:.2f} (target <= 0.5): {'met' if ratio <= 0.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
