"""Point-to-point as gloo users rely on it, each case run on ruccl next to gloo with the
same code and the same assertions (real processes, 64 MB where size matters, 3 ranks
where a third changes something):

- both ranks isend 64 MB before either posts its irecv;
- a receive posted before an all_reduce that its sender sends after;
- two isends with tags 1 and 2, received tag 2 first: each lands by tag;
- recv without a source (any source), which says who sent;
- work.wait(timeout) on a receive nobody matches raises instead of hanging (with
  ruccl the receive stays posted and a late send completes it; gloo closes its
  connections);
- a default timeout set on the backend (_set_default_timeout) bounds a barrier that a
  rank never joins (and, with ruccl, a receive nobody matches).
And ruccl's own: _abort_process_group returns a blocked wait within a second, and the
other rank, blocked in a barrier, learns of it (gloo waits out the op's timeout: no
comparison)."""

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_harness import free_port, init_pg, ruccl_specific, run_workers

BACKENDS = ["ruccl", "gloo"]
MB64 = 16 << 20  # float32 elements


def _init(rank, ws, backend, port, timeout=timedelta(seconds=60)):
    init_pg(rank, ws, f"tcp://127.0.0.1:{port}", timeout=timeout, backend=backend)


def _msg(src, dst, n, tag=0):
    return torch.arange(n, dtype=torch.float32) + (src * 1000 + dst * 10 + tag)


def both_send_first(rank, ws, backend, port, n):
    _init(rank, ws, backend, port)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    got = torch.zeros(n)
    s = dist.isend(_msg(rank, nxt, n), dst=nxt)
    r = dist.irecv(got, src=prv)
    r.wait()
    s.wait()
    assert torch.equal(got, _msg(prv, rank, n)), "wrong bytes"
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ws", [2, 3])
def test_every_rank_sends_64mb_before_receiving(backend, ws):
    run_workers(ws, both_send_first, backend, free_port(), MB64, timeout=120)


def receive_across_all_reduce(rank, ws, backend, port):
    _init(rank, ws, backend, port)
    got = torch.zeros(1000)
    r = dist.irecv(got, src=1) if rank == 0 else None
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(ws)] * 4
    if rank == 1:
        dist.send(_msg(1, 0, 1000), dst=0)
    if r is not None:
        r.wait()
        assert torch.equal(got, _msg(1, 0, 1000))
    dist.all_reduce(t)
    assert t.tolist() == [float(ws * ws)] * 4
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ws", [2, 3])
def test_receive_posted_before_a_collective_its_sender_sends_after(backend, ws):
    run_workers(ws, receive_across_all_reduce, backend, free_port())


def tags_out_of_order(rank, ws, backend, port, n):
    _init(rank, ws, backend, port)
    if rank == 0:
        works = [dist.isend(_msg(0, 1, n, tag), dst=1, tag=tag) for tag in (1, 2)]
    else:
        two, one = torch.zeros(n), torch.zeros(n)
        works = [dist.irecv(two, src=0, tag=2), dist.irecv(one, src=0, tag=1)]
    for w in works:
        w.wait()
    if rank == 1:
        assert torch.equal(one, _msg(0, 1, n, 1)), "tag 1's buffer got other data"
        assert torch.equal(two, _msg(0, 1, n, 2)), "tag 2's buffer got other data"
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n", [1, MB64])
def test_tags_deliver_to_the_right_buffer(backend, n):
    run_workers(2, tags_out_of_order, backend, free_port(), n, timeout=120)


def any_source(rank, ws, backend, port):
    _init(rank, ws, backend, port)
    if rank != 0:
        dist.send(torch.full((3,), float(rank)), dst=0)
    else:
        seen = []
        for _ in range(ws - 1):
            t = torch.zeros(3)
            src = dist.recv(t)  # no source: whoever sends
            assert t.tolist() == [float(src)] * 3, (src, t.tolist())
            seen.append(src)
        assert sorted(seen) == list(range(1, ws)), seen
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_receive_from_any_source(backend):
    run_workers(3, any_source, backend, free_port())


def wait_with_timeout(rank, ws, backend, port):
    _init(rank, ws, backend, port)
    if rank == 0:
        got = torch.zeros(5)
        w = dist.irecv(got, src=1, tag=7)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            w.wait(timeout=timedelta(milliseconds=300))
        took = time.monotonic() - t0
        assert took < 5, f"wait(timeout=300 ms) took {took:.1f} s"
    if backend == "gloo":  # gloo closes its connections after a wait times out
        return
    dist.barrier()
    if backend == "ruccl":  # the receive stayed posted: a late send completes it
        if rank == 1:
            dist.send(torch.full((5,), 3.0), dst=0, tag=7)
        else:
            w.wait()
            assert got.tolist() == [3.0] * 5
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_work_wait_timeout(backend):
    run_workers(2, wait_with_timeout, backend, free_port())


def default_timeout(rank, ws, backend, port):
    _init(rank, ws, backend, port)
    dist.group.WORLD._get_backend(torch.device("cpu"))._set_default_timeout(timedelta(seconds=1))
    if rank == 0:
        if backend == "ruccl":  # gloo's receives keep their own timeout
            t0 = time.monotonic()
            with pytest.raises(RuntimeError) as err:
                dist.recv(torch.zeros(2), src=1, tag=9)
            took = time.monotonic() - t0
            assert 0.9 < took < 10, f"the receive's 1 s timeout took {took:.1f} s"
            assert str(err.value).startswith("RUCCL_ERR_TIMEOUT"), str(err.value)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            dist.barrier()  # rank 1 never joins
        took = time.monotonic() - t0
        assert 0.9 < took < 10, f"the barrier's 1 s timeout took {took:.1f} s"
    else:
        time.sleep(5)  # joins nothing meanwhile


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_default_timeout(backend):
    run_workers(2, default_timeout, backend, free_port())


def abort_while_waiting(rank, ws, backend, port):
    _init(rank, ws, backend, port, timeout=timedelta(seconds=60))
    if rank == 0:
        got = torch.zeros(4)
        w = dist.irecv(got, src=1)
        aborted = []

        def abort_later():
            time.sleep(0.5)
            aborted.append(time.monotonic())
            dist.distributed_c10d._abort_process_group()

        threading.Thread(target=abort_later, daemon=True).start()
        with pytest.raises(RuntimeError) as err:
            w.wait()
        took = time.monotonic() - aborted[0]
        assert took < 1.0, f"the wait returned {took:.2f} s after the abort"
        assert "RUCCL_ERR_ABORTED" in str(err.value), str(err.value)
        return took
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        dist.barrier()  # rank 0 never joins it
    took = time.monotonic() - t0
    assert "RUCCL_ERR_ABORTED" in str(err.value), str(err.value)
    assert took < 10, f"the barrier learnt of the abort after {took:.1f} s"
    dist.destroy_process_group()
    return took


@ruccl_specific
def test_abort_process_group_returns_within_a_second():
    took = run_workers(2, abort_while_waiting, "ruccl", free_port())
    assert took[0] < 1.0
