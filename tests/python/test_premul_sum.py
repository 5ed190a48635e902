"""ReduceOp.PREMUL_SUM: the sum of every rank's input multiplied by its own factor.

gloo refuses it ("Cannot use ReduceOp.PREMUL_SUM with Gloo"); FSDP2 reduce-scatters its
gradients with PREMUL_SUM(1/f) when a divide factor is set.  The rule is the core's:
fp16 and bf16 are widened to float32, multiplied and summed there, and rounded once; float32
and float64 work in their own width.  At 2 ranks the sum's order does not matter, so the
results are compared bit for bit with that rule computed locally.  Each rank uses a factor
of its own, so a rank that applied another's (or none) is caught.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_harness import IS_GLOO

pytestmark = pytest.mark.skipif(IS_GLOO, reason="RUCCL_PY_BACKEND=gloo: gloo refuses PREMUL_SUM")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
COUNT = 1000


def _wide(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _factor(rank):
    return 0.3 + 0.7 * rank  # not a power of two: the products round


def _input(rank, dtype, n=COUNT, salt=0):
    g = torch.Generator().manual_seed(77 + 10 * rank + salt)
    return (torch.randn(n, generator=g) * 3).to(dtype)


def _op(rank, form, dtype):
    if form == "double":
        return dist._make_nccl_premul_sum(_factor(rank))
    return dist._make_nccl_premul_sum(torch.tensor([_factor(rank)], dtype=_wide(dtype)))


def _expected(ws, dtype, n=COUNT, salt=0):
    """The core's rule, computed here: widen, multiply, sum (rank order), round once."""
    w = _wide(dtype)
    total = None
    for r in range(ws):
        term = _input(r, dtype, n, salt).to(w) * torch.tensor(_factor(r), dtype=w)
        total = term if total is None else total + term
    return total.to(dtype)


def _twice_rounded(ws, dtype, n=COUNT, salt=0):
    """What multiplying in the narrow dtype first would give (two roundings)."""
    total = None
    for r in range(ws):
        term = (_input(r, dtype, n, salt) * _factor(r)).to(_wide(dtype))
        total = term if total is None else total + term
    return total.to(dtype)


def _check(got, want, what):
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert torch.equal(got, want), f"{what}: differs by {(got.double() - want.double()).abs().max().item():.3g}"


def w_premul(rank, ws, form):
    out = []
    for dtype in DTYPES:
        op = _op(rank, form, dtype)
        want = _expected(ws, dtype)
        if dtype in (torch.float16, torch.bfloat16):
            assert not torch.equal(want, _twice_rounded(ws, dtype)), "the data cannot tell one rounding from two"

        t = _input(rank, dtype)
        dist.all_reduce(t, op=op)
        _check(t, want, f"all_reduce {dtype} ({form})")

        t = _input(rank, dtype)
        dist.reduce(t, dst=1, op=op)
        if rank == 1:
            _check(t, want, f"reduce {dtype} ({form})")
        else:
            _check(t, _input(rank, dtype), f"reduce {dtype}: a non-root's input must stay as it was")

        t = _input(rank, dtype)
        o = torch.empty(COUNT // ws, dtype=dtype)
        dist.reduce_scatter_tensor(o, t, op=op)
        _check(o, want.view(ws, -1)[rank], f"reduce_scatter_tensor {dtype} ({form})")
        _check(t, _input(rank, dtype), f"reduce_scatter_tensor {dtype}: the input must stay as it was")

        o = torch.empty(COUNT // ws, dtype=dtype)
        dist.reduce_scatter(o, list(_input(rank, dtype).view(ws, -1).unbind(0)), op=op)
        _check(o, want.view(ws, -1)[rank], f"reduce_scatter (list) {dtype} ({form})")

        # coalesced: all-reduces, then reduce-scatters, two tensors each
        from torch.distributed.distributed_c10d import _coalescing_manager
        a, b = _input(rank, dtype, salt=1), _input(rank, dtype, n=64, salt=2)
        with _coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op)
        cm.wait()
        _check(a, _expected(ws, dtype, salt=1), f"coalesced all_reduce {dtype} ({form})")
        _check(b, _expected(ws, dtype, n=64, salt=2), f"coalesced all_reduce {dtype} ({form}), second")
        ins = [_input(rank, dtype, salt=3), _input(rank, dtype, n=64, salt=4)]
        outs = [torch.empty(COUNT // ws, dtype=dtype), torch.empty(64 // ws, dtype=dtype)]
        with _coalescing_manager():
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=op)
        _check(outs[0], _expected(ws, dtype, salt=3).view(ws, -1)[rank], f"coalesced reduce_scatter {dtype}")
        _check(outs[1], _expected(ws, dtype, n=64, salt=4).view(ws, -1)[rank],
               f"coalesced reduce_scatter {dtype}, second")
        out.append(str(dtype))
    return out


@pytest.mark.parametrize("form", ["double", "tensor"])
def test_premul_sum_every_floating_dtype_and_collective(pools, form):
    pools.run(2, w_premul, form)


def w_premul_refused(rank, ws):
    t = torch.arange(8)
    try:
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    except RuntimeError as e:
        msg = str(e)
    else:
        raise AssertionError("PREMUL_SUM on int64 was accepted")
    assert msg.startswith("RUCCL_ERR_UNSUPPORTED"), msg
    assert "PREMUL_SUM" in msg and "Long" in msg, msg
    assert torch.equal(t, torch.arange(8)), "a refused call changed its tensor"
    t = torch.ones(4)
    dist.all_reduce(t)  # the group goes on
    assert torch.equal(t, torch.full((4,), float(ws)))
    return msg


def test_premul_sum_on_integers_is_the_same_clear_error_everywhere(pools):
    msgs = pools.run(2, w_premul_refused)
    assert len(set(msgs)) == 1, msgs


# --------------------------------------------------------------------------------------
# FSDP2 with a gradient divide factor


def _fsdp_sgd(rank, mesh, divide_factor, force_sum):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():  # each FSDP module holds its own setting (as torchtitan sets it)
        if divide_factor is not None and hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(divide_factor)
        if force_sum and hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(1000 + 100 * rank + step)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def w_fsdp_divide_factor(rank, ws):
    from torch.distributed.device_mesh import DeviceMesh
    gloo = dist.new_group(backend="gloo")
    ours_mesh, gloo_mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu"), DeviceMesh.from_group(gloo, "cpu")
    factor = 3.0  # not the world size: FSDP2 reduce-scatters with PREMUL_SUM(1/3)
    ours = _fsdp_sgd(rank, ours_mesh, factor, force_sum=False)
    # the same job on gloo is refused: so the run above did go through PREMUL_SUM
    try:
        _fsdp_sgd(rank, gloo_mesh, factor, force_sum=False)
    except (RuntimeError, ValueError) as e:
        assert "PREMUL_SUM" in str(e), e
    else:
        raise AssertionError("gloo trained FSDP2 with a divide factor: PREMUL_SUM was not used")
    # the reference: SUM over gloo, then an explicit division by the factor
    reference = _fsdp_sgd(rank, gloo_mesh, factor, force_sum=True)
    plain = _fsdp_sgd(rank, gloo_mesh, None, force_sum=True)  # the factor must make a difference
    for i, (a, b) in enumerate(zip(ours, reference)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), \
            f"parameter {i}: PREMUL_SUM and SUM-then-divide differ by {(a - b).abs().max().item():.3g}"
    assert any(not torch.allclose(a, c, rtol=1e-4, atol=1e-5) for a, c in zip(ours, plain)), \
        "the divide factor made no difference"
    dist.destroy_process_group(gloo)


def test_fsdp2_with_a_gradient_divide_factor_trains(pools):
    pools.run(2, w_fsdp_divide_factor)
