#!/usr/bin/env python3
"""grad_bench.py -- gradient averaging and training checkpoints, side by side.

    python3 bench/grad_bench.py                      # 2 ranks, 100 x Linear(500, 500): 200 tensors, 25.05 M parameters
    python3 bench/grad_bench.py --layers 20 --iters 5 --dir /tmp/x   # quicker

Two processes (spawn); each opens the default process group on ruccl and a side group
on gloo.  In one run, on the same model and batch:

  local           forward + backward, no communication
  arg(ruccl)      forward + backward + ruccl_pg.all_reduce_gradients(model)        (default group)
  arg(gloo)       the same over the gloo group
  DDP(ruccl)      forward + backward of DistributedDataParallel(bucket_cap_mb=25) on ruccl
  DDP(gloo)       the same on gloo
  and the reduction alone: all_reduce_gradients on gradients already in place.

Each figure is the median over --iters timed iterations (after 2 warm-up ones) of the
slowest rank; the ranks start each iteration together (a barrier on the gloo group).
"reduction" = step - local (DDP overlaps its all-reduce with the backward pass, so its
reduction figure is what the overlap did not hide).

Checkpoints: after one AdamW step (model, optimizer state and pending gradients,
4 x the parameters' bytes per rank), both ranks at once: TrainingRecord.save into a new
directory (each rank's file written, hashed and fsynced, the manifest, the rename) and
TrainingRecord.load, against torch.save / torch.load of the same dict to one file per
rank, without and with an fsync.  Median of --save-iters.

Targets (reported, never the exit status): all_reduce_gradients within 1.2x of DDP on
ruccl, at least 3x faster than DDP on gloo (by step time and by reduction); save and
load within 1.5x of torch.save / torch.load.
"""
import argparse
import datetime
import os
import shutil
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_model(layers, width):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def worker(rank, world, port, args, q):
    sys.path.insert(0, ROOT)
    import ruccl_pg
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("ruccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))

    def timed_together(fns, iters):
        """Median lap of each fn (slowest rank), the fns interleaved in every round so that
        a noisy stretch of the machine hits them all alike."""
        laps = {k: [] for k in fns}
        for i in range(iters + 2):
            for k, fn in fns.items():
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                fn()
                lap = time.perf_counter() - t0
                if i >= 2:
                    laps[k].append(lap)
        out = {}
        for k in fns:
            mine = torch.tensor([statistics.median(laps[k])], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=gloo)
            out[k] = mine.item()
        return out

    model = make_model(args.layers, args.width)
    ddp_ruccl = DDP(make_model(args.layers, args.width), bucket_cap_mb=25)
    ddp_gloo = DDP(make_model(args.layers, args.width), process_group=gloo, bucket_cap_mb=25)

    def fwd_bwd(m):
        for p in m.parameters():
            p.grad = None
        m(x).square().mean().backward()

    res = {"params": sum(p.numel() for p in model.parameters()), "tensors": len(list(model.parameters()))}
    res.update(timed_together({
        "local": lambda: fwd_bwd(model),
        "arg(ruccl)": lambda: (fwd_bwd(model), ruccl_pg.all_reduce_gradients(model)),
        "DDP(ruccl)": lambda: fwd_bwd(ddp_ruccl),
        "arg(gloo)": lambda: (fwd_bwd(model), ruccl_pg.all_reduce_gradients(model, group=gloo)),
        "DDP(gloo)": lambda: fwd_bwd(ddp_gloo),
    }, args.iters))
    fwd_bwd(model)
    res.update(timed_together({
        "reduce only (ruccl)": lambda: ruccl_pg.all_reduce_gradients(model),
        "reduce only (gloo)": lambda: ruccl_pg.all_reduce_gradients(model, group=gloo),
    }, args.iters))
    del ddp_ruccl, ddp_gloo

    # checkpoints
    opt = torch.optim.AdamW(model.parameters())
    fwd_bwd(model)
    opt.step()
    fwd_bwd(model)  # pending gradients
    record = ruccl_pg.TrainingRecord(model, opt)
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "grads": {n: p.grad for n, p in model.named_parameters()}}
    base = os.path.join(args.dir, f"run-{port}")
    counter, records = iter(range(10 ** 6)), []

    def save_record():
        records.append(record.save(os.path.join(base, f"rec-{next(counter)}")))

    def load_record():
        record.load(records[0])

    def plain_save(sync):
        path = os.path.join(base, f"plain-{rank}-{next(counter)}.pt")
        with open(path, "wb") as f:
            torch.save(state, f)
            if sync:
                f.flush()
                os.fsync(f.fileno())

    def plain_load():
        torch.load(os.path.join(base, f"plain-{rank}-ref.pt"), weights_only=True)

    if rank == 0:
        os.makedirs(base, exist_ok=True)
    dist.barrier(group=gloo)
    torch.save(state, os.path.join(base, f"plain-{rank}-ref.pt"))
    res["state bytes/rank"] = os.path.getsize(os.path.join(base, f"plain-{rank}-ref.pt"))
    n = max(args.save_iters - 2, 1)
    res.update(timed_together({"torch.save": lambda: plain_save(False), "torch.save+fsync": lambda: plain_save(True),
                               "TrainingRecord.save": save_record}, n))
    res.update(timed_together({"torch.load": plain_load, "TrainingRecord.load": load_record}, n))
    dist.barrier(group=gloo)
    if rank == 0:
        shutil.rmtree(base, ignore_errors=True)
        q.put(res)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=100)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--save-iters", type=int, default=5)
    p.add_argument("--dir", default=os.path.join(ROOT, "build", "grad-bench"))
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, args, q)) for r in range(2)]
    for proc in procs:
        proc.start()
    res = None
    while res is None and any(proc.is_alive() for proc in procs):
        try:
            res = q.get(timeout=1)
        except Exception:  # noqa: BLE001 - queue.Empty
            pass
    for proc in procs:
        proc.join()
    if res is None:
        print("grad_bench: a rank failed (see above)", file=sys.stderr)
        return 1
    ms = lambda s: f"{s * 1e3:9.1f}"  # noqa: E731
    print(f"model: {args.layers} x Linear({args.width}, {args.width}): {res['tensors']} tensors, "
          f"{res['params'] / 1e6:.2f} M parameters ({res['params'] * 4 / 1e6:.0f} MB of float32 gradients); "
          f"2 ranks, batch {args.batch}, median of {args.iters} (slowest rank)")
    print(f"\n{'':22}{'step ms':>9}  {'reduction ms':>12}")
    for k in ("local", "arg(ruccl)", "DDP(ruccl)", "arg(gloo)", "DDP(gloo)"):
        red = "" if k == "local" else ms(res[k] - res["local"])
        print(f"{k:22}{ms(res[k])}  {red:>12}")
    for k in ("reduce only (ruccl)", "reduce only (gloo)"):
        print(f"{k:22}{'':9}  {ms(res[k]):>12}")
    arg, ddp, gl = res["arg(ruccl)"], res["DDP(ruccl)"], res["DDP(gloo)"]
    loc = res["local"]
    print("\ntargets:")
    print(f"  all_reduce_gradients vs DDP on ruccl: step {arg / ddp:.2f}x, reduction "
          f"{(arg - loc) / max(ddp - loc, 1e-9):.2f}x   (target <= 1.2x)")
    print(f"  DDP on gloo vs all_reduce_gradients: step {gl / arg:.2f}x, reduction "
          f"{(gl - loc) / max(arg - loc, 1e-9):.2f}x   (target >= 3x)")
    mb = res["state bytes/rank"] / 1e6
    print(f"\ncheckpoint, {mb:.0f} MB per rank, both ranks at once, median of {args.save_iters}:")
    for k in ("torch.save", "torch.save+fsync", "TrainingRecord.save", "torch.load", "TrainingRecord.load"):
        print(f"  {k:22}{ms(res[k])} ms")
    print(f"  save: {res['TrainingRecord.save'] / res['torch.save']:.2f}x torch.save, "
          f"{res['TrainingRecord.save'] / res['torch.save+fsync']:.2f}x torch.save+fsync; "
          f"load: {res['TrainingRecord.load'] / res['torch.load']:.2f}x torch.load   (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
