#!/usr/bin/env python3
"""One replica group of a torchft job on ruccl: torchft's Manager with DDP, on CPU.

    python3 examples/torchft_training.py --replica 0 --lighthouse http://HOST:PORT --steps 200
    python3 examples/torchft_training.py --replica 1 --lighthouse http://HOST:PORT --steps 200

Each process is a replica group of one rank.  torchft's lighthouse (from its wheel:
``torchft_lighthouse --min_replicas 1``, or scripts/torchft_drill.py, which starts one)
forms a quorum of the replica groups alive at each step; the Manager configures the
process group (``ruccl_pg.torchft.ProcessGroupRuccl``, or torchft's own
``ProcessGroupGloo`` with ``--backend gloo``) for each quorum, averages the gradients
across the groups, and commits a step only when every participant's all-reduce went
through.  A group that joins late (restarted after a crash) heals: it takes the
weights and the optimizer's state from a live peer and goes on from its step.

Each step prints one JSON line to stdout: the wall time, the step, whether it was
committed, how many replica groups took part, and whether this group healed.  At the
end, ``--out DIR/replica<R>.json`` gets the final step and a digest of the weights,
which must be the same for every group.
"""
import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import torchft
from torchft.process_group import ProcessGroupDummy, ProcessGroupGloo


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))


def batch(step, replica):
    g = torch.Generator().manual_seed(step * 1009 + replica)
    x = torch.randn(64, 32, generator=g)
    return x, x[:, :8].sin()


def ddp_over(manager, model):
    """DDP whose gradient buckets are averaged across the replica groups by the
    Manager (as torchft.DistributedDataParallel does: a dummy group soaks up DDP's own
    set-up).  torchft 0.2.0's hook asserts on a failed all-reduce and ends the process;
    this one leaves the failure to the Manager, which then does not commit the step."""
    ddp = nn.parallel.DistributedDataParallel(model, process_group=ProcessGroupDummy(0, 1),
                                              find_unused_parameters=True)

    def hook(state, bucket):
        buf = bucket.buffer()
        state.allreduce(buf).wait()  # an error is reported to the Manager: should_commit() says no
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut

    ddp.register_comm_hook(manager, hook)
    return ddp


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--lighthouse", default=os.environ.get("TORCHFT_LIGHTHOUSE"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--backend", choices=["ruccl", "gloo"], default="ruccl")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds: collectives and quorum")
    ap.add_argument("--step-time", type=float, default=0.02, help="seconds of extra compute per step")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not args.lighthouse:
        sys.exit("--lighthouse (or TORCHFT_LIGHTHOUSE) is needed: start torchft_lighthouse --min_replicas 1")

    timeout = timedelta(seconds=args.timeout)
    if args.backend == "ruccl":
        from ruccl_pg.torchft import ProcessGroupRuccl
        pg = ProcessGroupRuccl(timeout=timeout)
    else:
        pg = ProcessGroupGloo(timeout=timeout)

    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    healed = {"at": None}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])
        healed["at"] = time.time()

    def state_dict():
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = torchft.Manager(pg=pg, load_state_dict=load_state_dict, state_dict=state_dict, min_replica_size=1,
                              timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout, rank=0,
                              world_size=1, store_addr="localhost", store_port=store.port,
                              lighthouse_addr=args.lighthouse, replica_id=f"replica{args.replica}")
    ddp = ddp_over(manager, model)
    while manager.current_step() < args.steps:
        manager.start_quorum()
        opt.zero_grad(set_to_none=True)
        x, y = batch(manager.current_step(), args.replica)
        nn.functional.mse_loss(ddp(x), y).backward()
        time.sleep(args.step_time)  # the rest of a real step's compute
        committed = manager.should_commit()
        if committed:
            opt.step()
        print(json.dumps({"t": time.time(), "step": manager.current_step(), "committed": committed,
                          "participants": manager.num_participants(), "healed": healed["at"]}), flush=True)
        healed["at"] = None
    result = {"replica": args.replica, "step": manager.current_step(), "digest": digest(model)}
    print(json.dumps(result), flush=True)
    if args.out:
        with open(os.path.join(args.out, f"replica{args.replica}.json"), "w") as f:
            json.dump(result, f)
    manager.shutdown(wait=False)
    pg.shutdown()


if __name__ == "__main__":
    main()
