"""One rank of a job that loses a rank and goes on with dist.shrink_group (test_shrink.py).

    shrink_job.py SCENARIO OUT_DIR      (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

kill   DDP steps at 4 ranks; rank 3 kills itself (SIGKILL) while the others are in the
       third step's gradient all-reduce.  The survivors see the error, shrink the default
       group without rank 3, save the model (rank 0), then take 2 DDP steps over the 3.
stop   the same, but rank 3 freezes (SIGSTOP): the survivors find it at the liveness
       timeout (RUCCL_LIVENESS_TIMEOUT_MS).
abort  ranks 0-2 wait in an all-reduce rank 3 never joins; they shrink with
       SHRINK_ABORT, which ends it with RUCCL_ERR_REVOKED, then all-reduce over the 3.
fresh  the reference: a fresh 3-rank group loads the state the survivors saved and
       takes the same 2 steps.
deadpeer  3 ranks; rank 2 is killed; rank 0 shuts its group down
       (destroy_process_group), rank 1 aborts it: how long each took.
After the DDP steps, kill/stop/fresh also take 2 FSDP2 steps of a fresh model over the
(new) default group.
Each survivor writes OUT_DIR/rank<r>.json: the new rank and size, what failed, and the
model's parameters after the steps (as lists of floats, exactly).
"""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import ruccl_pg  # noqa: F401  (registers "ruccl")

scenario, out_dir = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def model_and_opt():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def batch(r, step):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def step(ddp, opt, r, s):
    x, y = batch(r, s)
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()


def report(extra):
    m = extra.pop("model")
    extra["params"] = [p.detach().reshape(-1).tolist() for p in m.parameters()]
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(extra, f)


def fsdp2_steps(r):
    """FSDP2 over a 1-D mesh of the current default group: 2 steps of a fresh model;
    its full parameters after them."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    m, _ = model_and_opt()
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    for s in range(2):
        x, y = batch(r, 20 + s)
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()
    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().reshape(-1).tolist() for p in m.parameters()]


def after_shrink(model, opt, failed):
    new_rank, new_size = dist.get_rank(), dist.get_world_size()
    if new_rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(out_dir, "state.pt"))
    dist.barrier()
    ddp = nn.parallel.DistributedDataParallel(model)
    for s in range(2):
        step(ddp, opt, new_rank, 10 + s)
    fsdp = fsdp2_steps(new_rank)
    t0 = time.monotonic()
    report({"old_rank": rank, "rank": new_rank, "size": new_size, "failed": failed, "model": model, "fsdp2": fsdp})
    dist.destroy_process_group()  # the old group (shut down by the shrink) and the new one
    print(f"rank {rank}: destroy_process_group took {time.monotonic() - t0:.3f} s", file=sys.stderr)


dist.init_process_group("ruccl", timeout=__import__("datetime").timedelta(seconds=60))

if scenario in ("kill", "stop"):
    model, opt = model_and_opt()
    ddp = nn.parallel.DistributedDataParallel(model)
    for s in range(2):
        step(ddp, opt, rank, s)
    if rank == 3:
        time.sleep(0.3)  # the others are in the next all-reduce by now
        os.kill(os.getpid(), signal.SIGKILL if scenario == "kill" else signal.SIGSTOP)
        time.sleep(3600)
    failed = ""
    try:
        step(ddp, opt, rank, 2)
    except Exception as e:  # noqa: BLE001  the error every survivor gets
        failed = str(e).splitlines()[0]
    t0 = time.monotonic()
    dist.shrink_group([3])
    print(f"rank {rank}: shrink_group took {time.monotonic() - t0:.3f} s", file=sys.stderr)
    model.zero_grad()  # the failed step's gradients are thrown away: the model is as after step 1
    after_shrink(model, opt, failed)
elif scenario == "abort":
    if rank == 3:
        time.sleep(2)  # never joins; excluded, it leaves without shrinking
        os._exit(0)
    t = torch.ones(1000)
    work = dist.all_reduce(t, async_op=True)
    time.sleep(0.5)  # blocked: rank 3 is not there
    t0 = time.monotonic()
    dist.shrink_group([3], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    took = time.monotonic() - t0
    failed = ""
    try:
        work.wait()
    except Exception as e:  # noqa: BLE001
        failed = str(e).splitlines()[0]
    u = torch.full((1000,), float(dist.get_rank() + 1))
    dist.all_reduce(u)
    model, _ = model_and_opt()
    report({"old_rank": rank, "rank": dist.get_rank(), "size": dist.get_world_size(), "failed": failed,
            "shrink_s": took, "sum": u[0].item(), "model": model})
    dist.destroy_process_group()
elif scenario == "fresh":
    model, opt = model_and_opt()
    state = torch.load(os.path.join(out_dir, "..", "shrunk", "state.pt"))
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    ddp = nn.parallel.DistributedDataParallel(model)
    for s in range(2):
        step(ddp, opt, rank, 10 + s)
    fsdp = fsdp2_steps(rank)
    report({"old_rank": rank, "rank": rank, "size": world, "failed": "", "model": model, "fsdp2": fsdp})
    dist.destroy_process_group()
elif scenario == "deadpeer":
    # rank 2 dies; rank 0 then shuts its group down, rank 1 aborts it: each within 1 s
    from torch.distributed.distributed_c10d import _abort_process_group
    t = torch.ones(1000)
    dist.all_reduce(t)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # it is gone
    failed = ""
    try:
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001
        failed = str(e).splitlines()[0]
    t0 = time.monotonic()
    if rank == 0:
        dist.destroy_process_group()
    else:
        _abort_process_group()
    took = time.monotonic() - t0
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "failed": failed, "took": took, "how": "shutdown" if rank == 0 else "abort"}, f)
