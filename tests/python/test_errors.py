"""Timeouts and contract violations, each in fresh worker processes (a failed
collective may leave a group unusable, so these never run in the shared pools)."""

import os
import re
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_harness import IS_GLOO, free_port, init_pg, ruccl_specific, run_workers

RUCCL_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "ruccl.h")


# --- timeout ----------------------------------------------------------------------------

TIMEOUT_S = 3


def w_timeout(rank, ws, port, done_file):
    init_pg(rank, ws, f"tcp://127.0.0.1:{port}", timeout=timedelta(seconds=TIMEOUT_S))
    t = torch.full((4,), rank + 1.0)
    dist.all_reduce(t)  # everyone is connected and working
    assert t.tolist() == [3.0] * 4, t
    result = None
    if rank == 0:
        err = None
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(6))  # rank 1 never enters this one
        except Exception as e:  # noqa: BLE001 - any error type, checked below
            err = e
        elapsed = time.monotonic() - start
        open(done_file, "w").close()
        assert err is not None, "all_reduce returned although rank 1 never called it"
        # the timeout is honoured: not before it, and not much after it
        assert TIMEOUT_S - 0.1 <= elapsed < 2 * TIMEOUT_S + 1.0, (
            f"error after {elapsed:.2f} s with a {TIMEOUT_S} s timeout: {err!r}")
        if IS_GLOO:
            assert re.search(r"timed? ?out", str(err), re.IGNORECASE), f"not a timeout: {str(err)!r}"
        else:  # ruccl-specific: the message names the ruccl error
            assert str(err).startswith("RUCCL_ERR_TIMEOUT"), f"message does not start with RUCCL_ERR_TIMEOUT: {str(err)!r}"
        result = [elapsed, str(err).splitlines()[0][:200] if str(err) else repr(err)]
    else:
        # stay alive (and out of the collective) until rank 0 has its error
        deadline = time.monotonic() + 60
        while not os.path.exists(done_file):
            assert time.monotonic() < deadline, "rank 0 never reported"
            time.sleep(0.05)
    dist.destroy_process_group()
    return result


def test_timeout_honoured(tmp_path):
    """init_process_group(timeout=3 s); rank 1 skips a collective that rank 0 enters:
    rank 0 gets an exception after the timeout: not before 3 s, and well before twice
    it (< 7 s).  The message says it is a timeout: RUCCL_ERR_TIMEOUT on ruccl, "timed
    out" on gloo."""
    results = run_workers(2, w_timeout, free_port(), str(tmp_path / "rank0-done"), timeout=90)
    elapsed, message = results[0]
    print(f"rank 0 failed after {elapsed:.2f} s: {message}")


# --- contract violations (ruccl-specific error names) -----------------------------------

# kind -> (error name, what each rank does); every other rank behaves like rank 0.
MISMATCHES = {
    "shape": "RUCCL_ERR_SHAPE_MISMATCH",  # all_reduce, rank 1 shape [5], others [4]
    "dtype": "RUCCL_ERR_DTYPE_MISMATCH",  # all_reduce, rank 1 int32, others float32 (same size)
    "broadcast_root": "RUCCL_ERR_ROOT_MISMATCH",  # broadcast, rank 1 src=1, others src=0
    "reduce_root": "RUCCL_ERR_ROOT_MISMATCH",  # reduce, rank 1 dst=1, others dst=0
    "op": "RUCCL_ERR_OP_MISMATCH",  # all_reduce, rank 1 MAX, others SUM
}


def test_error_names_exist_in_header():
    with open(RUCCL_H) as f:
        header = f.read()
    for name in set(MISMATCHES.values()) | {"RUCCL_ERR_TIMEOUT"}:
        assert f"  {name}," in header, f"{name} is not a ruccl_result_t in include/ruccl.h"


def _violate(rank, kind):
    odd = rank == 1
    if kind == "shape":
        dist.all_reduce(torch.ones(5 if odd else 4))
    elif kind == "dtype":
        dist.all_reduce(torch.ones(4, dtype=torch.int32 if odd else torch.float32))
    elif kind == "broadcast_root":
        dist.broadcast(torch.full((4,), float(rank)), src=1 if odd else 0)
    elif kind == "reduce_root":
        dist.reduce(torch.ones(4), dst=1 if odd else 0)
    elif kind == "op":
        dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    else:
        raise ValueError(kind)


def w_mismatch(rank, ws, port, kind):
    init_pg(rank, ws, f"tcp://127.0.0.1:{port}")
    code = MISMATCHES[kind]
    for attempt in range(2):  # twice: the group stays usable after each
        err = None
        try:
            _violate(rank, kind)
        except Exception as e:  # noqa: BLE001
            err = e
        assert err is not None, f"rank {rank}: no error for a {kind} mismatch (attempt {attempt})"
        assert str(err).startswith(code), f"rank {rank}: expected {code}..., got {str(err)!r}"
        # a matching collective afterwards works and gives the right value
        t = torch.full((4,), rank + 1.0)
        dist.all_reduce(t)
        assert t.tolist() == [ws * (ws + 1) / 2] * 4, f"all_reduce after the {kind} mismatch: {t.tolist()}"
        b = torch.full((3,), 7.0) if rank == ws - 1 else torch.zeros(3)
        dist.broadcast(b, src=ws - 1)
        assert b.tolist() == [7.0] * 3, f"broadcast after the {kind} mismatch: {b.tolist()}"
    dist.destroy_process_group()
    return str(err).splitlines()[0][:200]


@ruccl_specific
@pytest.mark.parametrize("ws", [2, 3])
@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_mismatch_error(ws, kind):
    messages = run_workers(ws, w_mismatch, free_port(), kind, timeout=90)
    for r, m in enumerate(messages):
        print(f"rank {r}: {m}")
