"""The modern torch.distributed stack on the backend under test, against the same work on gloo.

Each test runs one feature twice in the same worker processes: once over groups of the
backend under test (the default group, or groups made with its name) and once over gloo
groups made with ``new_group(backend="gloo")``, from the same start.  What the user sees
must be the same on both: weights after a few training steps, losses, gathered tensors,
loaded checkpoints.  At 2 ranks a sum of two values does not depend on the order it is
taken in, so most comparisons are exact; the 4-rank ones allow float32 reassociation.

Every test also checks that the work did something (parameters moved, the result is not
the input), so that two runs that both do nothing cannot agree.

Features: FSDP2, HSDP on a 2-D mesh (4 ranks), DTensor, tensor parallel, DCP save, load and
async save, pipelining, functional collectives (eager and under torch.compile), a DDP comm
hook with PowerSGD, ZeroRedundancyOptimizer, object collectives, ``_coalescing_manager``,
uneven ``all_to_all_single``, subgroups (4 ranks).
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import BACKEND, skip_on_gloo

STEPS = 3


# --------------------------------------------------------------------------------------
# helpers (run inside the workers)


# Every gloo group a test makes, held for the worker's life.  A DDP comm hook (PowerSGD)
# leaves Python callbacks on gloo's futures that hold the group; were the last reference
# dropped there, on one of gloo's own threads, ProcessGroupGloo's destructor would join
# that thread from itself and abort the process (std::system_error, "Resource deadlock
# avoided": seen in torch 2.13, 3 runs of 8).  Held here, the group is freed at exit.
_GLOO_GROUPS = []


def _groups():
    """(the world group of the backend under test, a new gloo group over every rank)."""
    gloo = dist.new_group(backend="gloo")
    _GLOO_GROUPS.append(gloo)
    return dist.group.WORLD, gloo


def _on_both(run):
    """(run(world group of the backend under test), run(a gloo group)), the gloo group
    made for the two runs and destroyed after them."""
    ours_g, gloo_g = _groups()
    ours, gloo = run(ours_g), run(gloo_g)
    dist.destroy_process_group(gloo_g)
    return ours, gloo


def _mlp(seed, width=16):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 4))


def _batch(rank, step, n=6):
    g = torch.Generator().manual_seed(1000 + 100 * rank + step)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


def _same(ours, gloo, what, exact=True):
    """Asserts two lists of tensors are equal (bitwise, or to float32 reassociation)."""
    assert len(ours) == len(gloo), (what, len(ours), len(gloo))
    for i, (a, b) in enumerate(zip(ours, gloo)):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, i, a.shape, b.shape, a.dtype, b.dtype)
        if exact:
            ok = torch.equal(a, b)
        else:
            ok = torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        assert ok, (f"{what} [{i}]: {BACKEND} and gloo differ by "
                    f"{(a.double() - b.double()).abs().max().item():.3g}")


def _moved(before, after, what):
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), f"{what}: nothing changed"


def _train(model, opt, batch_rank):
    """STEPS steps of an MSE regression on batch_rank's batches; the losses."""
    losses = []
    for step in range(STEPS):
        x, y = _batch(batch_rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses


def _mesh_training_matches_gloo(train, seed, what):
    """train(mesh) -> (full parameters, losses), over a 1-D mesh of the backend under test
    and one of gloo: the same numbers, and the parameters moved from _mlp(seed)'s."""
    from torch.distributed.device_mesh import DeviceMesh
    ours, gloo = _on_both(lambda g: train(DeviceMesh.from_group(g, "cpu")))
    _same(ours[0], gloo[0], f"{what} parameters")
    _same(ours[1], gloo[1], f"{what} losses")
    _moved(_full(_mlp(seed=seed).parameters()), ours[0], f"{what} training")


def _full(params):
    """Plain tensors of (possibly DTensor) parameters, full size."""
    from torch.distributed.tensor import DTensor
    return [(p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for p in params]


# --------------------------------------------------------------------------------------
# FSDP2 and HSDP


def _train_fsdp(rank, mesh, divide_factor=None):
    from torch.distributed.fsdp import fully_shard
    model = _mlp(seed=5)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if divide_factor is not None:
        model.set_gradient_divide_factor(divide_factor)
    losses = _train(model, torch.optim.Adam(model.parameters(), lr=0.01), rank)
    return _full(model.parameters()), losses


def w_fsdp2(rank, ws):
    _mesh_training_matches_gloo(lambda mesh: _train_fsdp(rank, mesh), 5, "FSDP2")


def test_fsdp2_matches_gloo(pools):
    pools.run(2, w_fsdp2)


def _mesh_2d(backend):
    """A 2x2 mesh (replicate, shard) over 4 ranks, its groups of ``backend``:
    replicate groups {0,2} {1,3}; shard groups {0,1} {2,3}."""
    from torch.distributed.device_mesh import DeviceMesh
    rank = dist.get_rank()
    rep = shard = None
    for ranks in ([0, 2], [1, 3]):
        g = dist.new_group(ranks, backend=backend)
        if rank in ranks:
            rep = g
    for ranks in ([0, 1], [2, 3]):
        g = dist.new_group(ranks, backend=backend)
        if rank in ranks:
            shard = g
    mesh = DeviceMesh.from_group([rep, shard], "cpu", mesh=torch.arange(4).view(2, 2),
                                 mesh_dim_names=("replicate", "shard"))
    return mesh, (rep, shard)


def w_hsdp(rank, ws):
    ours_mesh, ours_groups = _mesh_2d(BACKEND)
    gloo_mesh, gloo_groups = _mesh_2d("gloo")
    ours = _train_fsdp(rank, ours_mesh)
    gloo = _train_fsdp(rank, gloo_mesh)
    _same(ours[0], gloo[0], "HSDP parameters", exact=False)
    _same(ours[1], gloo[1], "HSDP losses", exact=False)
    _moved(_full(_mlp(seed=5).parameters()), ours[0], "HSDP training")
    # every rank holds the same full parameters
    flat = torch.cat([p.flatten() for p in ours[0]])
    everyone = [torch.empty_like(flat) for _ in range(ws)]
    dist.all_gather(everyone, flat)
    for r in range(ws):
        assert torch.equal(everyone[r], flat), f"HSDP: rank {r}'s parameters differ from rank {rank}'s"
    for g in ours_groups + gloo_groups:
        dist.destroy_process_group(g)


def test_hsdp_2d_mesh_matches_gloo(pools):
    pools.run(4, w_hsdp)


# --------------------------------------------------------------------------------------
# DTensor and tensor parallel


def _dtensor_ops(mesh):
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    torch.manual_seed(3)
    a = torch.randn(8, 6)
    b = torch.randn(6, 10)
    da = distribute_tensor(a, mesh, [Shard(0)])
    db = distribute_tensor(b, mesh, [Replicate()])
    out = []
    out.append((da @ db).full_tensor())                        # sharded matmul, all-gather
    out.append(da.redistribute(mesh, [Shard(1)]).to_local())   # all-to-all
    rank = dist.get_rank(mesh.get_group())
    partial = torch.distributed.tensor.DTensor.from_local(
        torch.full((3, 5), float(rank + 1)) * torch.arange(15.).view(3, 5), mesh, [Partial()])
    out.append(partial.redistribute(mesh, [Replicate()]).to_local())  # all-reduce
    out.append(partial.redistribute(mesh, [Shard(1)]).to_local())     # reduce-scatter
    out.append((da.sum() + da.mean()).full_tensor().reshape(1))       # reductions over shards
    return out


def w_dtensor(rank, ws):
    from torch.distributed.device_mesh import DeviceMesh
    ours, gloo = _on_both(lambda g: _dtensor_ops(DeviceMesh.from_group(g, "cpu")))
    _same(ours, gloo, "DTensor results")
    torch.manual_seed(3)
    a, b = torch.randn(8, 6), torch.randn(6, 10)
    assert torch.allclose(ours[0], a @ b, rtol=1e-5, atol=1e-5), "DTensor matmul is wrong"
    assert torch.equal(ours[2], sum(torch.full((3, 5), float(r + 1)) for r in range(ws)) * torch.arange(15.).view(3, 5))


def test_dtensor_matches_gloo(pools):
    pools.run(2, w_dtensor)


def _train_tp(rank, mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    model = _mlp(seed=9)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    losses = _train(model, torch.optim.SGD(model.parameters(), lr=0.05), 0)  # every rank: the same batch
    return _full(model.parameters()), losses


def w_tensor_parallel(rank, ws):
    _mesh_training_matches_gloo(lambda mesh: _train_tp(rank, mesh), 9, "tensor-parallel")


def test_tensor_parallel_matches_gloo(pools):
    pools.run(2, w_tensor_parallel)


# --------------------------------------------------------------------------------------
# distributed checkpoint (DCP)


def _sharded_state(mesh, seed):
    from torch.distributed.tensor import Shard, distribute_tensor
    torch.manual_seed(seed)
    return {"w": distribute_tensor(torch.randn(12, 5), mesh, [Shard(0)]),
            "b": distribute_tensor(torch.randn(7), mesh, [Shard(0)]),
            "step": torch.tensor(seed)}


def _dcp_round_trip(mesh, group, path, async_save):
    import torch.distributed.checkpoint as dcp
    state = _sharded_state(mesh, seed=21)
    if async_save:
        fut = dcp.async_save(state, checkpoint_id=path, process_group=group)
        fut.result()
    else:
        dcp.save(state, checkpoint_id=path, process_group=group)
    fresh = _sharded_state(mesh, seed=22)
    dcp.load(fresh, checkpoint_id=path, process_group=group)
    return [fresh["w"].full_tensor(), fresh["b"].full_tensor(), fresh["step"]]


def w_dcp(rank, ws, root):
    from torch.distributed.device_mesh import DeviceMesh
    ours_g, gloo_g = _groups()
    ours_mesh, gloo_mesh = DeviceMesh.from_group(ours_g, "cpu"), DeviceMesh.from_group(gloo_g, "cpu")
    for async_save in (False, True):
        tag = "async" if async_save else "sync"
        ours = _dcp_round_trip(ours_mesh, ours_g, os.path.join(root, f"{BACKEND}-{tag}"), async_save)
        gloo = _dcp_round_trip(gloo_mesh, gloo_g, os.path.join(root, f"gloo-{tag}"), async_save)
        _same(ours, gloo, f"DCP {tag} save then load")
        expected = _sharded_state(ours_mesh, seed=21)
        _same(ours, [expected["w"].full_tensor(), expected["b"].full_tensor(), expected["step"]],
              f"DCP {tag} load of what was saved")
    # what one backend saved, the other loads
    import torch.distributed.checkpoint as dcp
    fresh = _sharded_state(gloo_mesh, seed=23)
    dcp.load(fresh, checkpoint_id=os.path.join(root, f"{BACKEND}-sync"), process_group=gloo_g)
    _same([fresh["w"].full_tensor()], [ours[0]], "DCP: gloo loads the backend's checkpoint")
    dist.destroy_process_group(gloo_g)


def test_dcp_save_load_async_matches_gloo(pools):
    with tempfile.TemporaryDirectory() as root:
        pools.run(2, w_dcp, root)


# --------------------------------------------------------------------------------------
# pipelining


def _pipeline(rank, group):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    full = _mlp(seed=13)
    stage_mod = full[:2] if rank == 0 else full[2:]
    stage = PipelineStage(stage_mod, stage_index=rank, num_stages=2, device=torch.device("cpu"),
                          group=group)
    losses = []
    schedule = ScheduleGPipe(stage, n_microbatches=2,
                             loss_fn=lambda out, y: nn.functional.mse_loss(out, y))
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = _batch(0, step, n=8)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        else:
            step_losses = []
            schedule.step(target=y, losses=step_losses)
            losses.append(torch.stack(step_losses).detach().clone())
        opt.step()
    return [p.detach().clone() for p in stage_mod.parameters()], losses


def w_pipelining(rank, ws):
    ours, gloo = _on_both(lambda g: _pipeline(rank, g))
    _same(ours[0], gloo[0], "pipeline stage parameters")
    _same(ours[1], gloo[1], "pipeline losses")
    full = _mlp(seed=13)
    before = [p.detach().clone() for p in (full[:2] if rank == 0 else full[2:]).parameters()]
    _moved(before, ours[0], "pipeline training")


def test_pipelining_matches_gloo(pools):
    pools.run(2, w_pipelining)


# --------------------------------------------------------------------------------------
# functional collectives, eager and compiled


def _funcol_program(x, group):
    import torch.distributed._functional_collectives as funcol
    a = funcol.all_reduce(x * 2, "sum", group)
    b = funcol.all_gather_tensor(x + 1, 0, group)
    c = funcol.reduce_scatter_tensor(b * 3, "sum", 0, group)
    d = funcol.all_to_all_single(a.flatten(), None, None, group)
    return a.sum() + c.sum() + d.sum(), a, b, c, d


def w_functional(rank, ws, compiled):
    ours_g, gloo_g = _groups()
    x = torch.arange(12, dtype=torch.float32).view(4, 3) * (rank + 1)
    fn = _funcol_program
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(_funcol_program, fullgraph=True)
    ours = [t.clone() for t in fn(x, ours_g)]
    gloo = [t.clone() for t in fn(x, gloo_g)]
    eager_gloo = [t.clone() for t in _funcol_program(x, gloo_g)]
    _same(ours, gloo, f"functional collectives ({'compiled' if compiled else 'eager'})")
    _same(ours, eager_gloo, "functional collectives against eager gloo")
    total = sum(torch.arange(12, dtype=torch.float32).view(4, 3) * (r + 1) for r in range(ws))
    assert torch.equal(ours[1], total * 2), "functional all_reduce is wrong"
    dist.destroy_process_group(gloo_g)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_functional_collectives_match_gloo(pools, compiled):
    pools.run(2, w_functional, compiled, timeout=300 if compiled else 90)


# --------------------------------------------------------------------------------------
# DDP with the PowerSGD comm hook; ZeroRedundancyOptimizer


def _train_powersgd(rank, group):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _mlp(seed=31, width=32)
    ddp = DDP(model, process_group=group)
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, min_compression_rate=0.5,
                                   use_error_feedback=True, warm_start=True, random_seed=7)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS + 2):  # past start_powerSGD_iter: compressed steps too
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def w_powersgd(rank, ws):
    ours, gloo = _on_both(lambda g: _train_powersgd(rank, g))
    _same(ours, gloo, "DDP + PowerSGD parameters")
    _moved([p.detach() for p in _mlp(seed=31, width=32).parameters()], ours, "DDP + PowerSGD training")


def test_ddp_powersgd_hook_matches_gloo(pools):
    pools.run(2, w_powersgd)


def _train_zero(rank, group):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _mlp(seed=41)
    ddp = DDP(model, process_group=group)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                  process_group=group, lr=0.01)
    for step in range(STEPS):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    opt.consolidate_state_dict(to=0)
    state = opt.state_dict() if dist.get_rank(group) == 0 else None
    exp_avg = [] if state is None else [s["exp_avg"].clone() for _, s in sorted(state["state"].items())]
    return [p.detach().clone() for p in model.parameters()], exp_avg


def w_zero(rank, ws):
    ours, gloo = _on_both(lambda g: _train_zero(rank, g))
    _same(ours[0], gloo[0], "ZeroRedundancyOptimizer parameters")
    _same(ours[1], gloo[1], "ZeroRedundancyOptimizer consolidated state")
    _moved([p.detach() for p in _mlp(seed=41).parameters()], ours[0], "ZeroRedundancyOptimizer training")
    if rank == 0:
        assert len(ours[1]) == len(ours[0]), "the consolidated state misses parameters"


def test_zero_redundancy_optimizer_matches_gloo(pools):
    pools.run(2, w_zero)


# --------------------------------------------------------------------------------------
# object collectives, coalescing, uneven all_to_all_single


def _objects(rank, ws, group):
    mine = {"rank": rank, "name": f"r{rank}", "values": list(range(rank + 2))}
    gathered = [None] * ws
    dist.all_gather_object(gathered, mine, group=group)
    box = [{"from": 1, "payload": "x" * 300}, None] if rank == 1 else [None, None]
    dist.broadcast_object_list(box, src=1, group=group)
    at_root = [None] * ws if rank == 0 else None
    dist.gather_object(mine, at_root, dst=0, group=group)
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(ws)] if rank == 0 else None, src=0, group=group)
    return gathered, box, at_root, out


def w_objects(rank, ws):
    ours, gloo = _on_both(lambda g: _objects(rank, ws, g))
    assert ours == gloo, (ours, gloo)
    assert ours[0] == [{"rank": r, "name": f"r{r}", "values": list(range(r + 2))} for r in range(ws)]
    assert ours[1][0]["payload"] == "x" * 300
    assert ours[3] == [f"to {rank}"]


def test_object_collectives_match_gloo(pools):
    pools.run(2, w_objects)


def _coalesced(rank, ws, group, device=None):
    """device: torch's _coalescing_manager then brackets the coalesced calls with the
    backend's startCoalescing/endCoalescing (gloo has neither)."""
    from torch.distributed.distributed_c10d import _coalescing_manager
    a = torch.arange(5, dtype=torch.float32) + rank
    b = torch.arange(7, dtype=torch.float32) * (rank + 1)  # gloo: one dtype per coalesced all-reduce
    with _coalescing_manager(group=group, device=device, async_ops=True) as cm:
        dist.all_reduce(a, group=group)
        dist.all_reduce(b, group=group)
    cm.wait()
    inputs = [torch.arange(4, dtype=torch.float32) * (rank + 1) + i for i in range(2)]
    gathered = [torch.empty(4 * ws) for _ in range(2)]
    with _coalescing_manager(group=group, device=device):
        for out, inp in zip(gathered, inputs):
            dist.all_gather_into_tensor(out, inp, group=group)
    scattered = [torch.empty(4) for _ in range(2)]
    with _coalescing_manager(group=group, device=device):
        for out, inp in zip(scattered, gathered):
            dist.reduce_scatter_tensor(out, inp, group=group)
    return [a, b] + gathered + scattered


def w_coalescing(rank, ws):
    ours, gloo = _on_both(lambda g: _coalesced(rank, ws, g))
    _same(ours, gloo, "coalesced collectives")
    assert torch.equal(ours[0], sum(torch.arange(5, dtype=torch.float32) + r for r in range(ws)))


def test_coalescing_manager_matches_gloo(pools):
    pools.run(2, w_coalescing)


def w_coalescing_with_a_device(rank, ws):
    ours_g, gloo_g = _groups()
    ours = _coalesced(rank, ws, ours_g, device=torch.device("cpu"))
    gloo = _coalesced(rank, ws, gloo_g)  # gloo: "does not implement startCoalescing"
    _same(ours, gloo, "coalesced collectives in a block (device given)")
    dist.destroy_process_group(gloo_g)


@skip_on_gloo("gloo does not implement startCoalescing")
def test_coalescing_manager_with_a_device_beyond_gloo(pools):
    pools.run(2, w_coalescing_with_a_device)


def _uneven_a2a(rank, ws, group):
    # rank r sends (r + 1) * (d + 1) elements to rank d
    send_splits = [(rank + 1) * (d + 1) for d in range(ws)]
    recv_splits = [(s + 1) * (rank + 1) for s in range(ws)]
    x = torch.arange(sum(send_splits), dtype=torch.float32) + 1000 * rank
    out = torch.full((sum(recv_splits),), -1.0)
    dist.all_to_all_single(out, x, output_split_sizes=recv_splits, input_split_sizes=send_splits,
                           group=group)
    return out


def w_uneven_a2a(rank, ws):
    ours, gloo = _on_both(lambda g: _uneven_a2a(rank, ws, g))
    _same([ours], [gloo], "uneven all_to_all_single")
    expected = []
    for s in range(ws):
        off = sum((s + 1) * (d + 1) for d in range(rank))
        expected.append(torch.arange(off, off + (s + 1) * (rank + 1), dtype=torch.float32) + 1000 * s)
    assert torch.equal(ours, torch.cat(expected)), (ours, expected)


def test_uneven_all_to_all_single_matches_gloo(pools):
    pools.run(2, w_uneven_a2a)


# --------------------------------------------------------------------------------------
# subgroups


def _subgroup_work(rank, backend):
    sub, subs = dist.new_subgroups(group_size=2, backend=backend)  # {0,1} {2,3}
    pairs = [dist.new_group([0, 3], backend=backend), dist.new_group([1, 2], backend=backend)]
    mine = pairs[0] if rank in (0, 3) else pairs[1]
    x = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    a = x.clone()
    dist.all_reduce(a, group=sub)
    b = x.clone()
    dist.broadcast(b, src=dist.get_global_rank(mine, 1), group=mine)
    c = [torch.empty(2) for _ in range(2)]
    dist.all_gather(c, x, group=mine)
    r = x.clone()
    dist.reduce(r, dst=dist.get_global_rank(sub, 0), op=dist.ReduceOp.MAX, group=sub)
    for g in subs + pairs:
        dist.destroy_process_group(g)
    return [a, b, *c] + ([r] if dist.get_rank() in (0, 2) else [])


def w_subgroups(rank, ws):
    ours = _subgroup_work(rank, BACKEND)
    gloo = _subgroup_work(rank, "gloo")
    _same(ours, gloo, "subgroup collectives")
    first = rank - rank % 2
    assert torch.equal(ours[0], torch.tensor([first + 1 + first + 2.0, 10.0 * (first + 1 + first + 2)]))


def test_subgroups_match_gloo(pools):
    pools.run(4, w_subgroups)
