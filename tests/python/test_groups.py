"""Subgroups, destroy + re-init, and the three init methods."""

import gc
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from dist_harness import BACKEND, free_port, init_pg, run_workers, skip_on_gloo


# --- new_group ------------------------------------------------------------------------


def w_subgroups(rank, ws):
    assert ws == 3
    # every rank takes part in creating every group; only members call its collectives
    g12 = dist.new_group([1, 2])
    g0 = dist.new_group([0])
    g20 = dist.new_group([2, 0])

    if rank in (1, 2):
        assert dist.get_world_size(g12) == 2
        assert dist.get_rank(g12) == rank - 1
        assert dist.get_backend(g12) == BACKEND
        t = torch.tensor([10.0 * rank + 1, rank, -rank])
        dist.all_reduce(t, group=g12)
        assert t.tolist() == [32.0, 3.0, -3.0], t
        t = torch.arange(4, dtype=torch.int64) * rank
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g12)
        assert t.tolist() == [0, 2, 4, 6], t
        b = torch.full((5,), 9, dtype=torch.int32) if rank == 2 else torch.zeros(5, dtype=torch.int32)
        dist.broadcast(b, src=2, group=g12)  # src is a global rank
        assert b.tolist() == [9] * 5, b
        outs = [torch.zeros(2) for _ in range(2)]
        dist.all_gather(outs, torch.full((2,), float(rank)), group=g12)
        assert [o.tolist() for o in outs] == [[1.0, 1.0], [2.0, 2.0]], outs
    else:
        assert dist.get_rank(g12) == -1  # not a member

    if rank == 0:  # a group of one
        assert dist.get_world_size(g0) == 1
        assert dist.get_rank(g0) == 0
        t = torch.tensor([1.5, -2.0, 3.0])
        dist.all_reduce(t, group=g0)
        assert t.tolist() == [1.5, -2.0, 3.0], t
        dist.broadcast(t, src=0, group=g0)
        assert t.tolist() == [1.5, -2.0, 3.0], t
        outs = [torch.zeros(3)]
        dist.all_gather(outs, t, group=g0)
        assert outs[0].tolist() == [1.5, -2.0, 3.0], outs
        dist.barrier(group=g0)

    if rank in (0, 2):  # ranks given out of order; group rank follows global order
        assert dist.get_world_size(g20) == 2
        assert dist.get_rank(g20) == rank // 2
        b = torch.tensor([4.0, 5.0]) if rank == 2 else torch.zeros(2)
        dist.broadcast(b, src=2, group=g20)
        assert b.tolist() == [4.0, 5.0], b
        r = torch.full((2,), rank + 1.0)
        dist.reduce(r, dst=0, group=g20)
        if rank == 0:
            assert r.tolist() == [4.0, 4.0], r

    # the default group still works after the subgroups' traffic
    t = torch.full((3,), rank + 1.0)
    dist.all_reduce(t)
    assert t.tolist() == [6.0] * 3, t


def test_subgroups(pools):
    pools.run(3, w_subgroups)


# --- destroy, then init again ---------------------------------------------------------


def _check_world(rank, ws, tag):
    t = torch.full((4,), rank + 1.0)
    dist.all_reduce(t)
    assert t.tolist() == [ws * (ws + 1) / 2] * 4, f"{tag}: all_reduce gave {t.tolist()}"
    b = torch.arange(3) + 10 if rank == 0 else torch.zeros(3, dtype=torch.int64)
    dist.broadcast(b, src=0)
    assert b.tolist() == [10, 11, 12], f"{tag}: broadcast gave {b.tolist()}"


def w_reinit(rank, ws, port1, store_file, port2):
    sessions = [
        ("env:// first", "env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port1)}),
        ("file:// second", f"file://{store_file}", {}),
        ("env:// third, new port", "env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port2)}),
    ]
    for tag, method, env in sessions:
        os.environ.update(env)
        init_pg(rank, ws, method)
        _check_world(rank, ws, tag)
        dist.destroy_process_group()
        assert not dist.is_initialized(), f"{tag}: still initialised after destroy_process_group"


def test_destroy_and_reinit(tmp_path):
    run_workers(2, w_reinit, free_port(), str(tmp_path / "store"), free_port())


# --- init methods ---------------------------------------------------------------------


def w_init_method(rank, ws, method, arg):
    if method == "env":
        # everything from the environment, as torchrun passes it
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(arg), "RANK": str(rank), "WORLD_SIZE": str(ws)})
        dist.init_process_group(backend=BACKEND, init_method="env://")
        assert dist.get_rank() == rank and dist.get_world_size() == ws
    elif method == "tcp":
        init_pg(rank, ws, f"tcp://127.0.0.1:{arg}")
    elif method == "file":
        init_pg(rank, ws, f"file://{arg}")
    else:
        raise ValueError(method)
    t = torch.tensor([rank + 1.0, 2.0 * rank])
    dist.all_reduce(t)
    expected = [ws * (ws + 1) / 2, float(ws * (ws - 1))]
    assert t.tolist() == expected, f"{method}: all_reduce gave {t.tolist()}, expected {expected}"
    dist.destroy_process_group()


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_method(method, tmp_path):
    arg = str(tmp_path / "store") if method == "file" else free_port()
    run_workers(2, w_init_method, method, arg)


# --- destroy releases what the backend held -------------------------------------------


def _held():
    """What this process holds: its threads, its open file descriptors (by what each
    points to: sockets, pipes, files) and its /dev/shm mappings (from /proc/self/maps)."""
    threads = len(os.listdir("/proc/self/task"))
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the directory's own descriptor, closed by now
            pass
    with open("/proc/self/maps") as f:
        shm = sorted(line.split(None, 5)[5].strip() for line in f if "/dev/shm/" in line)
    return {"threads": threads, "fds": sorted(fds), "shm": shm}


def _counts(held):
    return {"threads": held["threads"], "fds": len(held["fds"]),
            "sockets": sum(f.startswith("socket:") for f in held["fds"]),
            "ruccl shm": sum("/dev/shm/ruccl-" in m for m in held["shm"])}


def w_release(rank, ws, ports):
    # torch's TCPStore server (libuv) opens a pipe pair once per process, on its first
    # loop, and keeps it for the process's life: one store made and dropped before the
    # baseline, so that the baseline holds it too.  No process group was made yet.
    dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    gc.collect()
    baseline = _held()
    seen, during = [], None
    for k, port in enumerate(ports):
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        init_pg(rank, ws, "env://")
        _check_world(rank, ws, f"cycle {k}")
        if k == 0:
            during = _held()
        dist.destroy_process_group()
        gc.collect()
        seen.append(_held())
    for k, after in enumerate(seen):
        assert after == baseline, (
            f"rank {rank}: after destroy {k} the process holds other things than before the first init:\n"
            f"  before: {_counts(baseline)}\n  after:  {_counts(after)}\n"
            f"  fds gone {sorted(set(baseline['fds']) - set(after['fds']))}, "
            f"new {sorted(set(after['fds']) - set(baseline['fds']))}\n"
            f"  shm gone {sorted(set(baseline['shm']) - set(after['shm']))}, "
            f"new {sorted(set(after['shm']) - set(baseline['shm']))}")
    # the comparison is not vacuous: a live group holds threads and sockets, and over
    # shared memory (the ranks share this machine) its mappings
    c_during, c_base = _counts(during), _counts(baseline)
    assert c_during["threads"] > c_base["threads"] and c_during["sockets"] > c_base["sockets"], (c_during, c_base)
    if BACKEND == "ruccl":
        assert c_during["ruccl shm"] > 0, f"no ruccl shared memory mapped in a live group: {c_during}"
    return c_base, c_during


def test_destroy_releases_threads_sockets_and_shared_memory():
    """Threads, file descriptors (sockets among them) and /dev/shm mappings after each of
    three init + destroy cycles are exactly those before the first init."""
    for r, (base, during) in enumerate(run_workers(2, w_release, [free_port() for _ in range(3)])):
        print(f"rank {r}: before the first init and after every destroy {base}, in a live group {during}")


def w_destroy_in_callback(rank, ws, port1, port2):
    """destroy_process_group() from a future callback (a thread of the backend itself):
    no crash, no hang, and the process can start a new group."""
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port1)})
    init_pg(rank, ws, "env://")
    t = torch.ones(3)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: dist.destroy_process_group() or f.value())
    assert fut.wait()[0].tolist() == [float(ws)] * 3
    assert not dist.is_initialized(), "destroyed in the callback"
    os.environ["MASTER_PORT"] = str(port2)
    init_pg(rank, ws, "env://")
    _check_world(rank, ws, "after a destroy in a callback")
    dist.destroy_process_group()


@skip_on_gloo("gloo aborts the process: its destructor joins the thread it runs on (std::system_error)")
def test_destroy_in_a_future_callback():
    run_workers(2, w_destroy_in_callback, free_port(), free_port())
