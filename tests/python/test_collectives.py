"""Every collective, dtype and reduce op against expected values, world sizes 2 and 3.

All run in the shared worker pools (one process group per world size).  Worker
functions (``w_*``) run on every rank and raise on a wrong value.
"""

import os
import time

import pytest
import torch
import torch.distributed as dist

from dist_harness import (
    send_recv_every_pair,
    DTYPE_OPS,
    DTYPES,
    assert_equal,
    payload,
    reduce_expected,
    reduce_input,
    reduce_op,
    sentinel,
    skip_on_gloo,
)

WORLD_SIZES = [2, 3]
SHAPES = [(), (7,), (2, 3, 4)]  # scalar, odd length, several dimensions
CHUNK_SHAPES = [(7,), (2, 3)]  # per-rank pieces of gathers, scatters, all-to-all

ws_param = pytest.mark.parametrize("ws", WORLD_SIZES)
dtype_param = pytest.mark.parametrize("dtype", list(DTYPES))
dtype_op_param = pytest.mark.parametrize("dtype,op", DTYPE_OPS)


# --- reductions -------------------------------------------------------------------------


def w_all_reduce(rank, ws, dtype_name, op):
    dtype = DTYPES[dtype_name]
    for shape in SHAPES:
        t = reduce_input(rank, ws, shape, dtype, op)
        expected = reduce_expected([reduce_input(r, ws, shape, dtype, op) for r in range(ws)], op, ws)
        dist.all_reduce(t, op=reduce_op(op))
        assert_equal(t, expected, f"all_reduce {op} {dtype_name} {shape}")


@ws_param
@dtype_op_param
def test_all_reduce(pools, ws, dtype, op):
    pools.run(ws, w_all_reduce, dtype, op)


def w_reduce(rank, ws, dtype_name, op):
    dtype = DTYPES[dtype_name]
    for root in range(ws):
        for shape in SHAPES:
            t = reduce_input(rank, ws, shape, dtype, op)
            expected = reduce_expected([reduce_input(r, ws, shape, dtype, op) for r in range(ws)], op, ws)
            dist.reduce(t, dst=root, op=reduce_op(op))
            if rank == root:  # elsewhere the tensor's contents are unspecified
                assert_equal(t, expected, f"reduce {op} {dtype_name} {shape} root {root}")


@ws_param
@dtype_op_param
def test_reduce(pools, ws, dtype, op):
    pools.run(ws, w_reduce, dtype, op)


def _rs_expected(rank, ws, shape, dtype, op):
    # rank r's chunk j is reduce_input(r, ..., salt=j); rank `rank` gets chunk `rank` reduced
    return reduce_expected([reduce_input(r, ws, shape, dtype, op, salt=rank) for r in range(ws)], op, ws)


def w_reduce_scatter(rank, ws, dtype_name, op):
    dtype = DTYPES[dtype_name]
    for shape in CHUNK_SHAPES:
        inputs = [reduce_input(rank, ws, shape, dtype, op, salt=j) for j in range(ws)]
        out = sentinel(shape, dtype)
        dist.reduce_scatter(out, inputs, op=reduce_op(op))
        assert_equal(out, _rs_expected(rank, ws, shape, dtype, op), f"reduce_scatter {op} {dtype_name} {shape}")


@ws_param
@dtype_op_param
def test_reduce_scatter(pools, ws, dtype, op):
    pools.run(ws, w_reduce_scatter, dtype, op)


def w_reduce_scatter_tensor(rank, ws, dtype_name, op, layout):
    dtype = DTYPES[dtype_name]
    for shape in CHUNK_SHAPES:
        chunks = [reduce_input(rank, ws, shape, dtype, op, salt=j) for j in range(ws)]
        # input concatenated along dim 0: (ws*shape[0], ...), or stacked: (ws, *shape)
        inp = torch.cat(chunks) if layout == "concat" else torch.stack(chunks)
        out = sentinel(shape, dtype)
        dist.reduce_scatter_tensor(out, inp, op=reduce_op(op))
        assert_equal(out, _rs_expected(rank, ws, shape, dtype, op), f"reduce_scatter_tensor({layout}) {op} {dtype_name} {shape}")


@ws_param
@dtype_op_param
def test_reduce_scatter_tensor(pools, ws, dtype, op):
    pools.run(ws, w_reduce_scatter_tensor, dtype, op, "concat")


@skip_on_gloo("gloo's reduce_scatter_tensor takes only the concatenated input layout, not the stacked (ws, *shape) one")
@ws_param
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_reduce_scatter_tensor_stacked(pools, ws, dtype):
    pools.run(ws, w_reduce_scatter_tensor, dtype, "SUM", "stacked")


# --- data movement ----------------------------------------------------------------------


def w_broadcast(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for root in range(ws):
        for shape in SHAPES:
            t = payload(root, 0, shape, dtype) if rank == root else sentinel(shape, dtype)
            dist.broadcast(t, src=root)
            assert_equal(t, payload(root, 0, shape, dtype), f"broadcast {dtype_name} {shape} root {root}")


@ws_param
@dtype_param
def test_broadcast(pools, ws, dtype):
    pools.run(ws, w_broadcast, dtype)


def w_all_gather(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for shape in CHUNK_SHAPES:
        outs = [sentinel(shape, dtype) for _ in range(ws)]
        t = payload(rank, 0, shape, dtype)
        dist.all_gather(outs, t)
        for j in range(ws):
            assert_equal(outs[j], payload(j, 0, shape, dtype), f"all_gather {dtype_name} {shape} [{j}]")
        assert_equal(t, payload(rank, 0, shape, dtype), "all_gather input left as it was")


@ws_param
@dtype_param
def test_all_gather(pools, ws, dtype):
    pools.run(ws, w_all_gather, dtype)


def w_all_gather_into_tensor(rank, ws, dtype_name, layout):
    dtype = DTYPES[dtype_name]
    for shape in CHUNK_SHAPES:
        expected = [payload(j, 0, shape, dtype) for j in range(ws)]
        t = payload(rank, 0, shape, dtype)
        # output concatenated along dim 0: (ws*shape[0], ...), or stacked: (ws, *shape)
        if layout == "concat":
            out, expected = sentinel((ws * shape[0],) + shape[1:], dtype), torch.cat(expected)
        else:
            out, expected = sentinel((ws,) + shape, dtype), torch.stack(expected)
        dist.all_gather_into_tensor(out, t)
        assert_equal(out, expected, f"all_gather_into_tensor({layout}) {dtype_name} {shape}")


@ws_param
@dtype_param
def test_all_gather_into_tensor(pools, ws, dtype):
    pools.run(ws, w_all_gather_into_tensor, dtype, "concat")


@skip_on_gloo("gloo's all_gather_into_tensor takes only the concatenated output layout, not the stacked (ws, *shape) one")
@ws_param
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_all_gather_into_tensor_stacked(pools, ws, dtype):
    pools.run(ws, w_all_gather_into_tensor, dtype, "stacked")


def w_gather(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for root in range(ws):
        for shape in CHUNK_SHAPES:
            outs = [sentinel(shape, dtype) for _ in range(ws)] if rank == root else None
            dist.gather(payload(rank, root, shape, dtype), outs, dst=root)
            if rank == root:
                for j in range(ws):
                    assert_equal(outs[j], payload(j, root, shape, dtype), f"gather {dtype_name} {shape} root {root} [{j}]")


@ws_param
@dtype_param
def test_gather(pools, ws, dtype):
    pools.run(ws, w_gather, dtype)


def w_scatter(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for root in range(ws):
        for shape in CHUNK_SHAPES:
            ins = [payload(root, j, shape, dtype) for j in range(ws)] if rank == root else None
            out = sentinel(shape, dtype)
            dist.scatter(out, ins, src=root)
            assert_equal(out, payload(root, rank, shape, dtype), f"scatter {dtype_name} {shape} root {root}")


@ws_param
@dtype_param
def test_scatter(pools, ws, dtype):
    pools.run(ws, w_scatter, dtype)


def w_all_to_all(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for shape in CHUNK_SHAPES:
        outs = [sentinel(shape, dtype) for _ in range(ws)]
        dist.all_to_all(outs, [payload(rank, j, shape, dtype) for j in range(ws)])
        for j in range(ws):
            assert_equal(outs[j], payload(j, rank, shape, dtype), f"all_to_all {dtype_name} {shape} from {j}")


@ws_param
@dtype_param
def test_all_to_all(pools, ws, dtype):
    pools.run(ws, w_all_to_all, dtype)


# Rows that rank s sends to rank d in the uneven exchanges: both kinds, one with zeros.
SPLITS = {
    "nonzero": lambda s, d: s + 2 * d + 1,
    "with_zero": lambda s, d: (s + 2 * d) % 3,
}


def w_all_to_all_uneven(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for kind, size in SPLITS.items():
        ins = [payload(rank, j, (size(rank, j), 3), dtype) for j in range(ws)]
        outs = [sentinel((size(j, rank), 3), dtype) for j in range(ws)]
        dist.all_to_all(outs, ins)
        for j in range(ws):
            assert_equal(outs[j], payload(j, rank, (size(j, rank), 3), dtype), f"all_to_all uneven {kind} {dtype_name} from {j}")


@skip_on_gloo("gloo's list all_to_all requires equally sized tensors")
@ws_param
@dtype_param
def test_all_to_all_uneven(pools, ws, dtype):
    pools.run(ws, w_all_to_all_uneven, dtype)


def w_all_to_all_single(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    # even: no split sizes, 1-D and several dimensions
    for shape in CHUNK_SHAPES:
        inp = torch.cat([payload(rank, j, shape, dtype) for j in range(ws)])
        out = sentinel(inp.shape, dtype)
        dist.all_to_all_single(out, inp)
        expected = torch.cat([payload(j, rank, shape, dtype) for j in range(ws)])
        assert_equal(out, expected, f"all_to_all_single even {dtype_name} {shape}")
    # uneven: explicit input/output split sizes (rows of dim 0), 1-D and 2-D
    for kind, size in SPLITS.items():
        for row in [(), (3,)]:
            in_splits = [size(rank, j) for j in range(ws)]
            out_splits = [size(j, rank) for j in range(ws)]
            inp = torch.cat([payload(rank, j, (size(rank, j),) + row, dtype) for j in range(ws)])
            out = sentinel((sum(out_splits),) + row, dtype)
            dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
            expected = torch.cat([payload(j, rank, (size(j, rank),) + row, dtype) for j in range(ws)])
            assert_equal(out, expected, f"all_to_all_single splits {kind} {dtype_name} row {row}")


@ws_param
@dtype_param
def test_all_to_all_single(pools, ws, dtype):
    pools.run(ws, w_all_to_all_single, dtype)


# --- point to point ---------------------------------------------------------------------


def w_send_recv(rank, ws, dtype_name):
    send_recv_every_pair(rank, ws, (5, 3), DTYPES[dtype_name], f"send/recv {dtype_name}")


@ws_param
@dtype_param
def test_send_recv(pools, ws, dtype):
    pools.run(ws, w_send_recv, dtype)


def w_isend_irecv(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    shape = (9,)
    works, received = [], {}
    # Every pair (a < b) exchanges both ways: a sends first, b receives first (safe even
    # for a backend that runs the operations one by one with blocking sends).
    for a in range(ws):
        for b in range(a + 1, ws):
            if rank == a:
                works.append(dist.isend(payload(a, b, shape, dtype), dst=b))
                received[b] = sentinel(shape, dtype)
                works.append(dist.irecv(received[b], src=b))
            elif rank == b:
                received[a] = sentinel(shape, dtype)
                works.append(dist.irecv(received[a], src=a))
                works.append(dist.isend(payload(b, a, shape, dtype), dst=a))
    for w in reversed(works):
        w.wait()
        assert w.is_completed()
    for peer, t in received.items():
        assert_equal(t, payload(peer, rank, shape, dtype), f"isend/irecv {dtype_name} {peer}->{rank}")


@ws_param
@dtype_param
def test_isend_irecv(pools, ws, dtype):
    pools.run(ws, w_isend_irecv, dtype)


def ring_exchange(rank, ws, shape, dtype, what):
    """Every rank sends to both ring neighbours and receives from both, in one batch."""
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    fwd = payload(rank, 1, shape, dtype)  # travels rank -> rank+1
    bwd = payload(rank, 2, shape, dtype)  # travels rank -> rank-1
    from_prev, from_next = sentinel(shape, dtype), sentinel(shape, dtype)
    ops = [
        dist.P2POp(dist.isend, fwd, nxt),
        dist.P2POp(dist.irecv, from_prev, prv),
        dist.P2POp(dist.isend, bwd, prv),
        dist.P2POp(dist.irecv, from_next, nxt),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_equal(from_prev, payload(prv, 1, shape, dtype), f"{what}: from previous rank {prv}")
    assert_equal(from_next, payload(nxt, 2, shape, dtype), f"{what}: from next rank {nxt}")


def w_batch_isend_irecv(rank, ws, dtype_name):
    dtype = DTYPES[dtype_name]
    for shape in [(4099,), (3, 5)]:
        ring_exchange(rank, ws, shape, dtype, f"batch_isend_irecv ring {dtype_name} {shape}")


@ws_param
@dtype_param
def test_batch_isend_irecv(pools, ws, dtype):
    pools.run(ws, w_batch_isend_irecv, dtype)


# --- barrier ----------------------------------------------------------------------------


def w_barrier(rank, ws, directory):
    # Each rank in turn arrives late and leaves a mark just before entering; nobody may
    # leave the barrier before the mark exists.
    for late in range(ws):
        mark = os.path.join(directory, f"arrived-{late}")
        if rank == late:
            time.sleep(0.4)
            open(mark, "w").close()
        dist.barrier()
        assert os.path.exists(mark), f"rank {rank} left the barrier before rank {late} entered it"
    dist.barrier()


@ws_param
def test_barrier(pools, ws, tmp_path):
    pools.run(ws, w_barrier, str(tmp_path))


# --- larger messages (chunked / pipelined paths) ----------------------------------------


def w_large(rank, ws):
    dtype, n = torch.float32, (1 << 18) + 3
    t = reduce_input(rank, ws, (n,), dtype, "SUM")
    expected = reduce_expected([reduce_input(r, ws, (n,), dtype, "SUM") for r in range(ws)], "SUM", ws)
    dist.all_reduce(t)
    assert_equal(t, expected, "large all_reduce")
    for root in range(ws):
        t = payload(root, 0, (n,), dtype) if rank == root else sentinel((n,), dtype)
        dist.broadcast(t, src=root)
        assert_equal(t, payload(root, 0, (n,), dtype), f"large broadcast root {root}")
    out = sentinel((ws * n,), dtype)
    dist.all_gather_into_tensor(out, payload(rank, 0, (n,), dtype))
    assert_equal(out, torch.cat([payload(j, 0, (n,), dtype) for j in range(ws)]), "large all_gather_into_tensor")
    chunks = [reduce_input(rank, ws, (n,), dtype, "MAX", salt=j) for j in range(ws)]
    out = sentinel((n,), dtype)
    dist.reduce_scatter_tensor(out, torch.cat(chunks), op=dist.ReduceOp.MAX)
    assert_equal(out, _rs_expected(rank, ws, (n,), dtype, "MAX"), "large reduce_scatter_tensor")
    inp = torch.cat([payload(rank, j, (n,), dtype) for j in range(ws)])
    out = sentinel(inp.shape, dtype)
    dist.all_to_all_single(out, inp)
    assert_equal(out, torch.cat([payload(j, rank, (n,), dtype) for j in range(ws)]), "large all_to_all_single")
    # 4 MiB each way: more than socket buffers hold, so blocking sends would deadlock
    ring_exchange(rank, ws, (1 << 20,), dtype, "large batch_isend_irecv ring")


@ws_param
def test_large_messages(pools, ws):
    pools.run(ws, w_large)


# --- non-contiguous tensors -------------------------------------------------------------
#
# Two kinds of (4, 3) non-contiguous views:
#   "transposed": base (3, 4) contiguous, view = base.t(), no gaps between the elements;
#   "strided":    base (3, 8), view = base[:, ::2].t(), the odd columns lie between the
#                 view's elements and must stay untouched.

NONCONTIG_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce")


def _view(layout, values):
    """(base, view, gaps): a non-contiguous (4, 3) view holding ``values``."""
    dtype = values.dtype
    if layout == "transposed":
        base = sentinel((3, 4), dtype)
        view, gaps = base.t(), base[:, 4:]  # no gaps: an empty slice
    else:
        base = sentinel((3, 8), dtype)
        view, gaps = base[:, ::2].t(), base[:, 1::2]
    assert not view.is_contiguous() and view.shape == (4, 3)
    view.copy_(values)
    return base, view, gaps


def w_noncontiguous(rank, ws, dtype_name, layout, collectives):
    dtype = DTYPES[dtype_name]
    shape = (4, 3)

    def untouched(gaps, what):
        assert_equal(gaps.contiguous(), sentinel(gaps.shape, dtype), f"{what} wrote outside the view ({layout})")

    if "all_reduce" in collectives:  # in place through the view
        for op in ("SUM", "MAX"):
            _, view, gaps = _view(layout, reduce_input(rank, ws, shape, dtype, op))
            dist.all_reduce(view, op=reduce_op(op))
            expected = reduce_expected([reduce_input(r, ws, shape, dtype, op) for r in range(ws)], op, ws)
            assert_equal(view.contiguous(), expected, f"all_reduce {op} {layout} {dtype_name}")
            untouched(gaps, "all_reduce")

    if "broadcast" in collectives:  # non-contiguous on the root and on the receivers
        for root in range(ws):
            _, view, gaps = _view(layout, payload(root, 0, shape, dtype) if rank == root else sentinel(shape, dtype))
            dist.broadcast(view, src=root)
            assert_equal(view.contiguous(), payload(root, 0, shape, dtype), f"broadcast {layout} {dtype_name} root {root}")
            untouched(gaps, "broadcast")

    if "all_gather" in collectives:  # non-contiguous input, output list of non-contiguous views
        _, view, _ = _view(layout, payload(rank, 0, shape, dtype))
        outs = [_view(layout, sentinel(shape, dtype)) for _ in range(ws)]
        dist.all_gather([o[1] for o in outs], view)
        for j, (_, out, gaps) in enumerate(outs):
            assert_equal(out.contiguous(), payload(j, 0, shape, dtype), f"all_gather {layout} {dtype_name} [{j}]")
            untouched(gaps, "all_gather")

    if "reduce" in collectives:
        for root in range(ws):
            _, view, gaps = _view(layout, reduce_input(rank, ws, shape, dtype, "SUM"))
            dist.reduce(view, dst=root, op=dist.ReduceOp.SUM)
            if rank == root:
                expected = reduce_expected([reduce_input(r, ws, shape, dtype, "SUM") for r in range(ws)], "SUM", ws)
                assert_equal(view.contiguous(), expected, f"reduce {layout} {dtype_name} root {root}")
            untouched(gaps, "reduce")


noncontig_dtypes = pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "uint8"])


@ws_param
@noncontig_dtypes
def test_noncontiguous_transposed(pools, ws, dtype):
    pools.run(ws, w_noncontiguous, dtype, "transposed", NONCONTIG_COLLECTIVES)


@ws_param
@noncontig_dtypes
def test_noncontiguous_strided_all_gather(pools, ws, dtype):
    pools.run(ws, w_noncontiguous, dtype, "strided", ("all_gather",))


@skip_on_gloo("gloo treats a view with gaps as dense (wrong values, writes between the elements)")
@ws_param
@noncontig_dtypes
@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce"])
def test_noncontiguous_strided(pools, ws, dtype, collective):
    pools.run(ws, w_noncontiguous, dtype, "strided", (collective,))
