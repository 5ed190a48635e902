"""CUDA tensors through the backend under test, in real processes: two ranks that share
GPU 0 (the shared 2-rank worker pool of conftest.py).

Every case that needs a GPU skips, saying so, where torch sees none
(tests/gpu/run_checks.sh runs them on a GPU machine).  On a GPU the cases hold
whichever way ruccl_pg was built: with CUDA (ruccl_pg.built_with_cuda(): CUDA tensors
go to the core as they are) or without (they are copied through host memory);
only the CUDA-graph refusal needs the CUDA build.

  - all_reduce / broadcast / all_gather / reduce_scatter (list and tensor forms) of
    CUDA float32 and bfloat16, small to 4 MB, contiguous and not, checked exactly;
  - async works and their futures; ops queued on one tensor run in order;
  - the stream contract: an input written by a kernel queued on the caller's current
    stream just before the call is what is reduced (the kernel is held back by a spin),
    the call does not block the caller meanwhile, and a kernel queued after wait()
    sees the result;
  - DDP on CUDA equal to DDP on gloo;
  - PREMUL_SUM of CUDA tensors with a factor on the device;
  - a collective inside CUDA graph capture is refused with a clear error, and the group
    goes on;
  - examples/collective_training.py run --device cuda, then resume, agreeing.

Without a GPU: ruccl_pg reports how it was built (a torch without CUDA cannot have a
CUDA build).  The example's refusal of --device cuda without a GPU is
test_training.py::test_device_cuda_without_a_gpu_is_a_clear_error.
"""
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dist_harness import (
    BACKEND,
    DTYPES,
    HERE,
    child_env,
    free_port,
    init_pg,
    payload,
    reduce_expected,
    reduce_input,
    reduce_op,
    run_workers,
    sentinel,
    skip_on_gloo,
)

ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "collective_training.py")

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
           f"CUDA {torch.version.cuda or 'not in this build'})")

SHAPES = [(7,), (2, 3, 4), (1 << 20,)]  # odd, several dimensions, 4 MB of float32
CUDA_DTYPES = ["float32", "bfloat16"]


def _dev():
    return torch.device("cuda", 0)


def _same(actual, expected, what):
    """Exact equality, reported by count and first mismatch (the tensors can be large)."""
    actual = actual.cpu()
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), \
        f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not torch.equal(actual, expected):
        bad = (actual != expected).flatten().nonzero().flatten()
        i = bad[0].item()
        raise AssertionError(f"{what} (rank {dist.get_rank()}): {bad.numel()} of {actual.numel()} elements wrong, "
                             f"first at {i}: got {actual.flatten()[i].item()}, expected {expected.flatten()[i].item()}")


# --- every collective, exactly --------------------------------------------------------


def w_collectives(rank, ws, dtype_name):
    dtype, dev = DTYPES[dtype_name], _dev()
    for shape in SHAPES:
        for op in ("SUM", "AVG", "MAX"):
            t = reduce_input(rank, ws, shape, dtype, op).to(dev)
            dist.all_reduce(t, op=reduce_op(op))
            expected = reduce_expected([reduce_input(r, ws, shape, dtype, op) for r in range(ws)], op, ws)
            _same(t, expected, f"all_reduce {op} {dtype_name} {shape}")
        for root in range(ws):
            t = (payload(root, 0, shape, dtype) if rank == root else sentinel(shape, dtype)).to(dev)
            dist.broadcast(t, src=root)
            _same(t, payload(root, 0, shape, dtype), f"broadcast from {root} {dtype_name} {shape}")
        mine = payload(rank, 0, shape, dtype).to(dev)
        outs = [sentinel(shape, dtype).to(dev) for _ in range(ws)]
        dist.all_gather(outs, mine)
        for r in range(ws):
            _same(outs[r], payload(r, 0, shape, dtype), f"all_gather block {r} {dtype_name} {shape}")
        flat = sentinel((ws * shape[0], *shape[1:]), dtype).to(dev)
        dist.all_gather_into_tensor(flat, mine)
        _same(flat, torch.cat([payload(r, 0, shape, dtype) for r in range(ws)]),
              f"all_gather_into_tensor {dtype_name} {shape}")
        chunks = [reduce_input(rank, ws, shape, dtype, "SUM", salt=j) for j in range(ws)]
        expected = reduce_expected([reduce_input(r, ws, shape, dtype, "SUM", salt=rank) for r in range(ws)],
                                   "SUM", ws)
        out = sentinel(shape, dtype).to(dev)
        dist.reduce_scatter(out, [c.to(dev) for c in chunks])
        _same(out, expected, f"reduce_scatter {dtype_name} {shape}")
        out = sentinel(shape, dtype).to(dev)
        dist.reduce_scatter_tensor(out, torch.cat(chunks).to(dev))
        _same(out, expected, f"reduce_scatter_tensor {dtype_name} {shape}")


@needs_cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_collectives_on_cuda_tensors(pools, dtype):
    pools.run(2, w_collectives, dtype)


def w_noncontiguous(rank, ws, dtype_name):
    """Every other column of a CUDA matrix: reduced in place, the columns between untouched."""
    dtype, dev = DTYPES[dtype_name], _dev()
    base = torch.full((64, 33), -1.0, dtype=dtype, device=dev)
    cols = base[:, ::2]
    assert not cols.is_contiguous()
    cols.copy_(reduce_input(rank, ws, tuple(cols.shape), dtype, "SUM").to(dev))
    dist.all_reduce(cols)
    expected = reduce_expected([reduce_input(r, ws, tuple(cols.shape), dtype, "SUM") for r in range(ws)], "SUM", ws)
    _same(cols, expected, f"all_reduce of a non-contiguous {dtype_name} view")
    _same(base[:, 1::2], torch.full((64, 16), -1.0, dtype=dtype), "the columns between")
    outs = [sentinel((33, 64), dtype).to(dev).t() for _ in range(ws)]  # transposed outputs
    dist.all_gather(outs, base)
    for r in range(ws):
        _same(outs[r], base.cpu(), f"all_gather into a transposed output, block {r}")


@needs_cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_noncontiguous_cuda_tensors(pools, dtype):
    pools.run(2, w_noncontiguous, dtype)


# --- async works and futures ----------------------------------------------------------


def w_async(rank, ws):
    dev = _dev()
    ts = [torch.full((1000,), float(rank + k), device=dev) for k in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    fut = works[0].get_future().then(lambda f: f.value()[0] * 2)
    u = torch.full((1 << 16,), float(rank + 1), device=dev)
    first = dist.all_reduce(u, async_op=True)
    second = dist.all_reduce(u, async_op=True)  # queued behind the first on the same tensor
    for w in works:
        assert w.wait()
        assert w.is_completed() and w.is_success()
    second.wait()
    first.wait()
    tri = ws * (ws - 1) / 2
    for k, t in enumerate(ts):
        _same(t, torch.full((1000,), k * ws + tri), f"async all_reduce {k}")
    _same(u, torch.full((1 << 16,), ws * (ws * (ws + 1) / 2)), "two all_reduces in a row on one tensor")
    doubled = fut.wait()
    assert doubled.device == dev, doubled.device
    _same(doubled, torch.full((1000,), 2 * tri), "future.then on the first work")
    # a future's value waited on another stream is ordered there
    v = torch.full((4096,), float(rank), device=dev)
    f2 = dist.all_reduce(v, async_op=True).get_future()
    s = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(s):
        got = f2.wait()[0] + 1
    s.synchronize()
    _same(got, torch.full((4096,), tri + 1), "future.wait() on a side stream")


@needs_cuda
def test_async_works_and_futures(pools):
    pools.run(2, w_async)


# --- the stream contract --------------------------------------------------------------


def _spin_cycles(ms):
    """torch.cuda._sleep cycles that keep the current stream busy for about ms milliseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * ms / max(start.elapsed_time(end), 1e-3))


def w_streams(rank, ws, async_op):
    dev = _dev()
    n = 1 << 20
    s = torch.cuda.Stream(device=dev)  # not the default stream: nothing is ordered by accident
    with torch.cuda.stream(s):
        cycles = _spin_cycles(400)
        t = torch.zeros(n, device=dev)
        torch.cuda._sleep(cycles)  # holds back the write below for ~400 ms
        t.add_(rank + 1)           # the input, written on the current stream just before the call
        issued = time.perf_counter()
        work = dist.all_reduce(t, async_op=async_op)
        issue_s = time.perf_counter() - issued
        if async_op:
            work.wait()
        out = t * 2                # queued after wait(): must see the result
        host = torch.empty(n, pin_memory=True)
        host.copy_(out, non_blocking=True)
    s.synchronize()
    expected = 2.0 * ws * (ws + 1) / 2
    _same(host, torch.full((n,), expected), f"stream contract (async_op={async_op})")
    _same(t, torch.full((n,), expected / 2), f"the all_reduced input (async_op={async_op})")
    return issue_s


@needs_cuda
@pytest.mark.parametrize("async_op", [True, False], ids=["async", "sync"])
def test_stream_contract(pools, async_op):
    issue_times = pools.run(2, w_streams, async_op)
    if async_op:  # the wait for the caller's stream is the worker's, not the caller's
        assert max(issue_times) < 0.2, f"issuing an async all_reduce blocked the caller for {issue_times} s"


# --- DDP ------------------------------------------------------------------------------

STEPS, LR = 5, 0.1


def _model(seed, dev):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(dev)


def _batch(rank, step, dev):
    g = torch.Generator().manual_seed(1000 + 100 * rank + step)
    return torch.randn(8, 6, generator=g).to(dev), torch.randn(8, 3, generator=g).to(dev)


def _train_ddp(rank, group, dev):
    model = _model(17 + rank, dev)  # DDP's initial broadcast must make rank 0's start everyone's
    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = _batch(rank, step, dev)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    torch.cuda.synchronize(dev)
    return [p.detach().cpu().clone() for p in model.parameters()]


def w_ddp_cuda(rank, ws):
    dev = _dev()
    gloo = dist.new_group(backend="gloo")
    initial = [p.detach().cpu().clone() for p in _model(17, dev).parameters()]
    ours = _train_ddp(rank, None, dev)
    ref = _train_ddp(rank, gloo, dev)
    for i, (a, b, p0) in enumerate(zip(ours, ref, initial)):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), \
            f"parameter {i}: {BACKEND} vs gloo differ by {(a - b).abs().max().item():.3g}"
        assert not torch.allclose(a, p0, rtol=0, atol=1e-4), f"parameter {i} did not move in training"
    flat = torch.cat([p.flatten() for p in ours])
    everyone = [torch.empty_like(flat) for _ in range(ws)]
    dist.all_gather(everyone, flat, group=gloo)  # CPU tensors, over gloo
    for r in range(ws):
        assert torch.equal(everyone[r], flat), f"rank {r}'s parameters differ from rank {rank}'s"
    dist.destroy_process_group(gloo)


@needs_cuda
def test_ddp_on_cuda_matches_gloo(pools):
    pools.run(2, w_ddp_cuda)


# --- CUDA graphs ----------------------------------------------------------------------


def w_capture_refused(rank, ws, init_method):
    init_pg(rank, ws, init_method)
    try:
        dev = _dev()
        t = torch.ones(16, device=dev)
        s = torch.cuda.Stream(device=dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        graph = torch.cuda.CUDAGraph()
        error = None
        try:
            with torch.cuda.graph(graph, stream=s):
                dist.all_reduce(t)
        except RuntimeError as e:
            error = str(e)
        assert error is not None, "an all_reduce inside CUDA graph capture was not refused"
        assert "ruccl: collectives cannot be captured into a CUDA graph" in error, error
        torch.cuda.synchronize(dev)
        dist.all_reduce(t)  # the group goes on, outside the capture
        _same(t, torch.full((16,), float(ws)), "all_reduce after the refused capture")
    finally:
        dist.destroy_process_group()


def w_premul_sum_on_cuda(rank, ws):
    # PREMUL_SUM of CUDA tensors, the factor a double or a one-element CUDA tensor (applied
    # on the device); the core's rule: widen fp16/bf16 to float32, multiply, sum, round once.
    dev = torch.device("cuda", 0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        wide = torch.float32
        for form in ("double", "tensor"):
            factor = 0.3 + 0.7 * rank
            op = dist._make_nccl_premul_sum(
                factor if form == "double" else torch.tensor([factor], dtype=wide, device=dev))
            inputs = [(torch.randn(4096, generator=torch.Generator().manual_seed(5 + r)) * 3).to(dtype)
                      for r in range(ws)]
            want = sum(x.to(wide) * torch.tensor(0.3 + 0.7 * r, dtype=wide) for r, x in enumerate(inputs)).to(dtype)
            t = inputs[rank].to(dev)
            dist.all_reduce(t, op=op)
            assert torch.equal(t.cpu(), want), f"all_reduce {dtype} ({form}) on CUDA"
            o = torch.empty(4096 // ws, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(o, inputs[rank].to(dev), op=op)
            assert torch.equal(o.cpu(), want.view(ws, -1)[rank]), f"reduce_scatter_tensor {dtype} ({form}) on CUDA"


@needs_cuda
@skip_on_gloo("gloo refuses PREMUL_SUM")
def test_premul_sum_on_cuda_with_a_device_factor(pools):
    pools.run(2, w_premul_sum_on_cuda)


@needs_cuda
@skip_on_gloo("ruccl's own refusal of CUDA graph capture")
def test_cuda_graph_capture_is_refused():
    import ruccl_pg

    if not ruccl_pg.built_with_cuda():
        pytest.skip("ruccl_pg is built without CUDA (ruccl_pg.built_with_cuda() is False): the refusal is "
                    "the CUDA build's")
    # fresh processes: a capture gone wrong must not break the shared pool
    run_workers(2, w_capture_refused, f"tcp://127.0.0.1:{free_port()}")


# --- the training example -------------------------------------------------------------


def _example(*args, timeout=240):
    p = subprocess.run([sys.executable, EXAMPLE, *map(str, args)], env=child_env(), capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout.splitlines(), p.stderr


@needs_cuda
@skip_on_gloo("the example trains on ruccl")
def test_training_example_on_cuda_run_then_resume(tmp_path):
    rc, ran, err = _example("run", tmp_path / "state", "--device", "cuda")
    assert rc == 0, err[-4000:]
    assert len(ran) == 2 and all(line.startswith(f"rank {r} final checksum: ") for r, line in enumerate(ran)), ran
    assert len({line.split()[-1] for line in ran}) == 1, f"the ranks' models differ: {ran}"
    rc, resumed, err = _example("resume", tmp_path / "state", "--device", "cuda")
    assert rc == 0, err[-4000:]
    assert resumed == ran, f"resume ended elsewhere than run:\n  run    {ran}\n  resume {resumed}"


# --- without a GPU too ----------------------------------------------------------------


@skip_on_gloo("ruccl_pg's own build report")
def test_the_extension_reports_whether_it_was_built_with_cuda():
    """built_with_cuda() is a bool; False whenever torch has no CUDA (there is nothing to
    build against); RUCCL_CUDA=1 / 0 in the environment (what setup.py was asked for,
    as tests/gpu/run_checks.sh sets it) must be what was built."""
    import ruccl_pg

    built = ruccl_pg.built_with_cuda()
    assert built in (True, False), built
    if torch.version.cuda is None:
        assert built is False, f"a CUDA build of ruccl_pg under a torch without CUDA ({torch.__version__})"
    asked = os.environ.get("RUCCL_CUDA", "").strip()
    if asked == "1":
        assert built, "RUCCL_CUDA=1 but ruccl_pg.built_with_cuda() is False: rebuild with setup.py"
    elif asked == "0":
        assert not built, "RUCCL_CUDA=0 but ruccl_pg.built_with_cuda() is True: rebuild with setup.py"
