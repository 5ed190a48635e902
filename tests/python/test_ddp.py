"""DistributedDataParallel on the backend under test against the same run on gloo.

In the same worker processes: one training run with DDP over the default group (the
backend under test), one over a gloo group made with new_group(backend="gloo"), from
the same start; final parameters must agree to rtol 1e-6 / atol 1e-7.  Both must also
agree (looser, float32 summation order) with a single-process run of the same
arithmetic, and the parameters must have moved.

Each rank seeds its model differently: the runs are right only if DDP's initial
broadcast of rank 0's parameters (over the group's backend) worked.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 5
LR = 0.1


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 + 100 * rank + step)
    return torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)


def _train_ddp(rank, group):
    model = _model(seed=17 + rank)
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _train_reference(ws):
    """What DDP computes: the gradient averaged over the ranks' losses, from rank 0's start."""
    model = _model(seed=17)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(nn.functional.mse_loss(model(x), y) for x, y in (_batch(r, step) for r in range(ws))) / ws
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def w_ddp(rank, ws):
    gloo = dist.new_group(backend="gloo")
    initial = [p.detach().clone() for p in _model(seed=17).parameters()]
    ours = _train_ddp(rank, None)  # default group: the backend under test
    ref_gloo = _train_ddp(rank, gloo)
    reference = _train_reference(ws)
    for i, (a, b, c, p0) in enumerate(zip(ours, ref_gloo, reference, initial)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), \
            f"parameter {i}: backend vs gloo differ by {(a - b).abs().max().item():.3g}"
        assert torch.allclose(a, c, rtol=1e-5, atol=1e-6), \
            f"parameter {i}: backend vs single-process reference differ by {(a - c).abs().max().item():.3g}"
        assert not torch.allclose(a, p0, rtol=0, atol=1e-4), f"parameter {i} did not move in training"
    # every rank ends with the same parameters (compared over gloo)
    flat = torch.cat([p.flatten() for p in ours])
    everyone = [torch.empty_like(flat) for _ in range(ws)]
    dist.all_gather(everyone, flat, group=gloo)
    for r in range(ws):
        assert torch.equal(everyone[r], flat), f"rank {r}'s parameters differ from rank {rank}'s"
    dist.destroy_process_group(gloo)


@pytest.mark.parametrize("ws", [2, 3])
def test_ddp_matches_gloo(pools, ws):
    pools.run(ws, w_ddp)
