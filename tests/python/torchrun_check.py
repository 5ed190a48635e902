"""Worker script for the torchrun tests (test_torchrun.py); also usable by hand:

    RUCCL_PY_BACKEND=gloo python3 -m torch.distributed.run --standalone --nproc-per-node 2 tests/python/torchrun_check.py

Backend from RUCCL_PY_BACKEND (default ruccl; ruccl imports ruccl_pg first).  Rank,
world size and rendezvous come from torchrun's environment (env://).  Checks
all_reduce, broadcast and all_gather results; exits 1 on a mismatch (an exception
exits non-zero too).  Prints one "torchrun_check OK rank R/W" line on success.
RUCCL_EXPECT_WORLD_SIZE, when set, must equal the world size.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main():
    backend = os.environ.get("RUCCL_PY_BACKEND", "").strip() or "ruccl"
    if backend == "ruccl":
        import ruccl_pg  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=60))
    rank, ws = dist.get_rank(), dist.get_world_size()
    failures = []

    def check(what, got, expected):
        if got != expected:
            failures.append(f"{what}: got {got}, expected {expected}")

    expect_ws = os.environ.get("RUCCL_EXPECT_WORLD_SIZE")
    if expect_ws is not None:
        check("world size", ws, int(expect_ws))
    check("RANK", rank, int(os.environ["RANK"]))
    check("backend", dist.get_backend(), backend)

    t = torch.tensor([rank + 1.0, -2.0 * rank, 3.0])
    dist.all_reduce(t)
    check("all_reduce SUM", t.tolist(), [ws * (ws + 1) / 2, -float(ws * (ws - 1)), 3.0 * ws])

    t = torch.tensor([rank, 10 - rank], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check("all_reduce MAX", t.tolist(), [ws - 1, 10])

    for root in range(ws):
        b = torch.arange(5, dtype=torch.float32) + 100 * root if rank == root else torch.zeros(5)
        dist.broadcast(b, src=root)
        check(f"broadcast from {root}", b.tolist(), [100.0 * root + k for k in range(5)])

    outs = [torch.zeros(3, dtype=torch.int32) for _ in range(ws)]
    dist.all_gather(outs, torch.tensor([rank, rank * rank, 7], dtype=torch.int32))
    check("all_gather", [o.tolist() for o in outs], [[r, r * r, 7] for r in range(ws)])

    dist.barrier()
    dist.destroy_process_group()
    if failures:
        for f in failures:
            print(f"torchrun_check FAIL rank {rank}/{ws}: {f}", flush=True)
        sys.exit(1)
    print(f"torchrun_check OK rank {rank}/{ws}", flush=True)


if __name__ == "__main__":
    main()
