"""ruccl_pg.torchft.ProcessGroupRuccl under torchft's own test helpers (torchft 0.2.0).

Ranks are threads of this process, as in torchft's MultiPgBaseTest: every collective
torchft's helpers run (``_test_pg``, ``_COLLECTIVE_TO_FUNC``), reduce_scatter and
reduce_scatter_tensor_coalesced included (torchft's helpers skip those on CPU, so they
are checked here too), then one rank shuts down, the others see a ruccl error (also in
``errored()``), reconfigure without it and run again.  Skipped where torchft is not
installed (``.ci/run`` installs it).
"""
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

torchft = pytest.importorskip("torchft")
pytest.importorskip("parameterized")  # torchft's test module imports it
from torch._C._distributed_c10d import ReduceOp, ReduceScatterOptions  # noqa: E402
from torchft import process_group_test as tft  # noqa: E402

from dist_harness import IS_GLOO  # noqa: E402

pytestmark = pytest.mark.skipif(IS_GLOO, reason="RUCCL_PY_BACKEND=gloo: this is ruccl's torchft adapter")

from ruccl_pg.torchft import ProcessGroupRuccl  # noqa: E402

WORLD = 3


def _store():
    return dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)


def _on_ranks(pool, fn, n=WORLD):
    futs = [pool.submit(fn, r) for r in range(n)]
    return [f.result(timeout=120) for f in futs]


def _reduce_scatter(pg, rank, _tensor):
    ws = pg.size()
    rows = [torch.arange(r * ws + 1, r * ws + ws + 1, dtype=torch.float32) * (rank + 1) for r in range(ws)]
    out = torch.zeros(ws)
    opts = ReduceScatterOptions()
    opts.reduceOp = ReduceOp.SUM
    pg.reduce_scatter([out], [rows], opts).wait()
    want = torch.arange(rank * ws + 1, rank * ws + ws + 1, dtype=torch.float32) * sum(range(1, ws + 1))
    torch.testing.assert_close(out, want)


def _reduce_scatter_coalesced(pg, rank, _tensor):
    ws = pg.size()
    ins = [torch.arange(ws * ws, dtype=torch.float32).reshape(ws, ws) * (k + 1) * (rank + 1) for k in range(2)]
    outs = [torch.zeros(ws) for _ in range(2)]
    opts = ReduceScatterOptions()
    opts.reduceOp = ReduceOp.SUM
    pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
    total = sum(range(1, ws + 1))
    for k in range(2):
        torch.testing.assert_close(outs[k], torch.arange(ws * ws, dtype=torch.float32).reshape(ws, ws)[rank]
                                   * (k + 1) * total)


CHECKS = dict(tft._COLLECTIVE_TO_FUNC, reduce_scatter=_reduce_scatter,
              reduce_scatter_tensor_coalesced=_reduce_scatter_coalesced)


def test_every_collective_of_torchfts_single_rank_helper_runs():
    store = _store()
    pg = ProcessGroupRuccl(timeout=timedelta(seconds=10))
    pg.configure(f"localhost:{store.port}/single", "0", 0, 1)
    works = tft._test_pg(pg, torch.tensor([2.0]))
    assert set(works) == {"allreduce", "allreduce_coalesced", "allgather", "allgather_into_tensor_coalesced",
                          "alltoall_base", "barrier", "broadcast", "broadcast_one", "reduce_scatter",
                          "reduce_scatter_tensor_coalesced"}, "a collective was skipped as unsupported"
    assert pg.errored() is None
    assert pg.getBackendName() == "torchft-ruccl"
    pg.shutdown()


def test_every_collective_on_threads_then_a_rank_goes_and_the_others_reconfigure():
    store = _store()
    pgs = [ProcessGroupRuccl(timeout=timedelta(seconds=10)) for _ in range(WORLD)]
    with ThreadPoolExecutor(max_workers=WORLD) as pool:
        _on_ranks(pool, lambda r: pgs[r].configure(f"localhost:{store.port}/first", "0", r, WORLD))
        for name in sorted(CHECKS):
            _on_ranks(pool, lambda r, name=name: CHECKS[name](pgs[r], r, torch.tensor([r + 1])))

        # the last rank leaves; the others' next collective fails with a ruccl error
        def lose(r):
            if r == WORLD - 1:
                pgs[r].shutdown()
                return None
            t = torch.ones(4)
            with pytest.raises(Exception, match="RUCCL_ERR_(PEER_FINISHED|PEER_LOST)"):
                pgs[r].allreduce([t], dist.AllreduceOptions()).wait()
            return pgs[r].errored()

        errs = _on_ranks(pool, lose)
        for r in range(WORLD - 1):
            assert errs[r] is not None and "RUCCL_ERR_" in str(errs[r]), errs[r]

        # the survivors reconfigure into a clean group of two and go on
        def again(r):
            pgs[r].configure(f"localhost:{store.port}/second", "0", r, WORLD - 1)
            assert pgs[r].errored() is None
            t = torch.full((4,), float(r + 1))
            pgs[r].allreduce([t], dist.AllreduceOptions()).wait()
            assert t.tolist() == [3.0] * 4
            _reduce_scatter(pgs[r], r, None)
            return True

        assert _on_ranks(pool, again, WORLD - 1) == [True, True]
        for r in range(WORLD - 1):
            pgs[r].shutdown()


def test_abort_is_errored_and_quick():
    store = _store()
    pgs = [ProcessGroupRuccl(timeout=timedelta(seconds=10)) for _ in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        _on_ranks(pool, lambda r: pgs[r].configure(f"localhost:{store.port}/ab", "0", r, 2), 2)
        import time
        t0 = time.monotonic()
        pgs[0].abort()
        took = time.monotonic() - t0
        assert took < 1.0, took
        assert "ABORTED" in str(pgs[0].errored())
        pgs[1].abort(errored=False)
