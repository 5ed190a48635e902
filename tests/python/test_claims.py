"""Claims of the README and the backend's docs, each checked in real processes:

- RUCCL_SECRET and RUCCL_SECRET_FILE override the session secret rank 0 shares
  through torch's store; without them each process WARNs that the store guards it;
- ruccl_pg.node_address(): RUCCL_NODE_ADDRESS, else the route toward MASTER_ADDR, else
  127.0.0.1; and a group whose data ports are bound to RUCCL_NODE_ADDRESS works;
- BAND/BOR on bool reduce exactly; the unsupported ops fail with RUCCL_ERR_UNSUPPORTED
  on every rank and leave the group usable;
- RUCCL_TRANSPORT=tcp: the collectives over TCP only, exact;
- a rank killed with SIGKILL inside an all_reduce: every other rank gets
  RUCCL_ERR_PEER_LOST well before the group's timeout;
- WorkerPool.close (the harness) reports a destroy_process_group that failed.

ruccl's logs (RUCCL_DEBUG=INFO) go to the process's stderr (fd 2) from C; a worker
catches them by pointing fd 2 at a file for the span it looks at (capture_fd2).
"""

import contextlib
import ipaddress
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import dist_harness
from dist_harness import (
    IS_GLOO,
    WorkerPool,
    assert_equal,
    free_port,
    init_pg,
    payload,
    reduce_expected,
    reduce_input,
    reduce_op,
    ruccl_specific,
    run_workers,
    sentinel,
    skip_on_gloo,
)

SHM_LOG = "shared memory with node"  # links.c, offer_shm(): only when the link is shared memory
CONNECTED_LOG = re.compile(r"node (\d+): connected to node (\d+) at ([0-9.]+):(\d+)")  # ruccl_net_connect_all()


# --------------------------------------------------------------------------------------
# worker-side helpers


@contextlib.contextmanager
def capture_fd2(path):
    """Points this process's fd 2 (where ruccl's C code logs) at ``path`` meanwhile."""
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def file_barrier(directory, name, rank, ws, timeout=30.0):
    """Every rank leaves a mark and waits for everyone's (no process group needed)."""
    open(os.path.join(directory, f"{name}.{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(directory, f"{name}.{r}")) for r in range(ws)):
        assert time.monotonic() < deadline, f"rank {rank}: not every rank reached {name}"
        time.sleep(0.02)


def _all_reduce_check(rank, ws, tag):
    t = torch.arange(5, dtype=torch.float32) + rank
    dist.all_reduce(t)
    expected = [float(ws * i + ws * (ws - 1) // 2) for i in range(5)]
    assert t.tolist() == expected, f"{tag}: all_reduce gave {t.tolist()}, expected {expected}"


# --------------------------------------------------------------------------------------
# 1. RUCCL_SECRET


SECRET_TIMEOUT = timedelta(seconds=3)


def w_secret(rank, ws, ports, directory):
    """Four sessions, each on its own port, the ranks in step between them (a file
    barrier: a failed init leaves no group to synchronise with).  Returns, per session,
    (error or None, the ruccl log of this rank's init)."""
    secret_file = os.path.join(directory, "secret")
    if rank == 0:
        with open(secret_file + ".tmp", "wb") as f:
            f.write(b"from a file\n\x00\xff")
        os.replace(secret_file + ".tmp", secret_file)
    scenarios = [
        ("different", f"secret-of-rank-{rank}"),
        ("same", "one-secret-for-all"),
        ("file", ("file", secret_file)),
        ("store", None),  # both: rank 0 publishes one in the store, with a WARN
        ("rank 1 only", "rank-1-alone" if rank == 1 else None),
        ("rank 0 only", "rank-0-alone" if rank == 0 else None),
    ]
    results = {}
    for k, (name, secret) in enumerate(scenarios):
        file_barrier(directory, f"start-{k}", rank, ws)
        os.environ.pop("RUCCL_SECRET", None)
        os.environ.pop("RUCCL_SECRET_FILE", None)
        if isinstance(secret, tuple):
            os.environ["RUCCL_SECRET_FILE"] = secret[1]
        elif secret is not None:
            os.environ["RUCCL_SECRET"] = secret
        log = os.path.join(directory, f"log-{k}-{rank}")
        err = None
        with capture_fd2(log):
            try:
                init_pg(rank, ws, f"tcp://127.0.0.1:{ports[k]}", timeout=SECRET_TIMEOUT)
            except RuntimeError as e:
                err = str(e)
        if err is None:
            _all_reduce_check(rank, ws, f"RUCCL_SECRET {name}")
            dist.destroy_process_group()
        assert not dist.is_initialized()
        results[name] = (err, read(log))
        file_barrier(directory, f"end-{k}", rank, ws)
    return results


@ruccl_specific
def test_ruccl_secret_overrides_the_store_secret(tmp_path):
    """Two ranks with different RUCCL_SECRET values cannot form the group: the one that
    connects (rank 1 -> rank 0) gets RUCCL_ERR_AUTH, the other refuses it (its log says
    RUCCL_ERR_AUTH) and, once rank 1's failed init has closed its data port, gets
    RUCCL_ERR_PEER_LOST from its set-up probe (not the timeout).  The same RUCCL_SECRET works.  A rank with
    RUCCL_SECRET does not use the secret rank 0 published in the store (rank 1 only:
    AUTH), and a rank 0 with RUCCL_SECRET publishes none (rank 0 only: rank 1 waits for
    the store's secret in vain).  RUCCL_SECRET_FILE works like RUCCL_SECRET (every byte
    of the file); the store's secret works and WARNs, once per process."""
    res = run_workers(2, w_secret, [free_port() for _ in range(6)], str(tmp_path),
                      env={"RUCCL_DEBUG": "INFO"}, timeout=60)
    r0, r1 = res

    for name in ("different", "rank 1 only"):
        (e0, log0), (e1, _) = r0[name], r1[name]
        assert e1 is not None and e1.startswith("RUCCL_ERR_AUTH"), f"{name}: rank 1: {e1!r}"
        assert e0 is not None and e0.startswith("RUCCL_ERR_PEER_LOST") and re.search(
            r"node 1's data port at \S+ refuses connections", e0), f"{name}: rank 0: {e0!r}"
        assert re.search(r"node 0: refused a connection on the data port \(RUCCL_ERR_AUTH", log0), (
            f"{name}: rank 0 did not log refusing rank 1 for its secret:\n{log0}")

    assert r0["same"][0] is None and r1["same"][0] is None, f"same RUCCL_SECRET: {r0['same'][0]!r}, {r1['same'][0]!r}"
    assert "node 1: connected to node 0" in r1["same"][1], r1["same"][1]

    # RUCCL_SECRET_FILE: every byte of the file (a newline, a NUL, 0xff) is the secret
    assert r0["file"][0] is None and r1["file"][0] is None, f"RUCCL_SECRET_FILE: {r0['file'][0]!r}, {r1['file'][0]!r}"
    # Without either, the store's secret works and each process says once how weak it is
    warn = "authentication is only as strong as access to the store"
    for r in (r0, r1):
        assert r["store"][0] is None, f"store secret: {r['store'][0]!r}"
        assert warn in r["store"][1], f"no WARN with the store's secret:\n{r['store'][1]}"
        for name in ("different", "same", "file"):
            assert warn not in r[name][1], f"{name}: a WARN although a secret was given:\n{r[name][1]}"

    e0, e1 = r0["rank 0 only"][0], r1["rank 0 only"][0]
    assert e1 is not None and e1.startswith("RUCCL_ERR_TIMEOUT") and "secret did not come through the store" in e1, (
        f"rank 0 only: rank 1: {e1!r}")
    assert e0 is not None and e0.startswith("RUCCL_ERR_TIMEOUT"), f"rank 0 only: rank 0: {e0!r}"


# --------------------------------------------------------------------------------------
# 2. RUCCL_NODE_ADDRESS and the route toward MASTER_ADDR


def _route_source(dest):
    """The local source address the kernel picks toward ``dest`` (iproute2), or None."""
    ip = shutil.which("ip")
    if not ip:
        return None
    p = subprocess.run([ip, "-o", "route", "get", dest], capture_output=True, text=True)
    m = re.search(r"\bsrc (\S+)", p.stdout)
    return m.group(1) if p.returncode == 0 and m else None


@ruccl_specific
def test_node_address_rules(monkeypatch):
    import ruccl_pg

    remote = "10.255.255.1"  # connect() on UDP only picks a route: no packet leaves
    monkeypatch.delenv("RUCCL_NODE_ADDRESS", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert ruccl_pg.node_address() == "127.0.0.1"
    for loopback in ("127.0.0.1", "localhost"):
        monkeypatch.setenv("MASTER_ADDR", loopback)
        assert ruccl_pg.node_address() == "127.0.0.1", loopback

    monkeypatch.setenv("RUCCL_NODE_ADDRESS", "10.11.12.13")  # wins over everything, used as given
    assert ruccl_pg.node_address() == "10.11.12.13"
    monkeypatch.setenv("MASTER_ADDR", remote)
    assert ruccl_pg.node_address() == "10.11.12.13"

    monkeypatch.delenv("RUCCL_NODE_ADDRESS")
    expected = _route_source(remote)
    if expected is None:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((remote, 9))
        except OSError as e:
            pytest.skip(f"no route toward {remote} on this machine ({e}): the MASTER_ADDR rule cannot be shown")
    got = ruccl_pg.node_address()
    assert not ipaddress.ip_address(got).is_loopback, f"node_address() toward {remote}: {got}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((got, 0))  # an address of this machine
    if expected is not None:
        assert got == expected, f"node_address() {got}, but `ip route get {remote}` says src {expected}"


def _listening(address):
    """Ports this process listens on (TCP, IPv4) at ``address``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    want = socket.inet_aton(address)[::-1].hex().upper()  # /proc/net/tcp: little-endian hex
    ports = []
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            addr, port = fields[1].split(":")
            if fields[3] == "0A" and addr == want and fields[9] in inodes:
                ports.append(int(port, 16))
    return ports


def w_node_address(rank, ws, port, directory):
    log = os.path.join(directory, f"log-{rank}")
    with capture_fd2(log):
        init_pg(rank, ws, f"tcp://127.0.0.1:{port}")
    _all_reduce_check(rank, ws, "RUCCL_NODE_ADDRESS=127.0.0.2")
    b = payload(ws - 1, 0, (9,), torch.int64) if rank == ws - 1 else sentinel((9,), torch.int64)
    dist.broadcast(b, src=ws - 1)
    assert_equal(b, payload(ws - 1, 0, (9,), torch.int64), "broadcast with RUCCL_NODE_ADDRESS=127.0.0.2")
    ports = _listening("127.0.0.2")
    dist.destroy_process_group()
    return ports, read(log)


@ruccl_specific
def test_group_works_on_ruccl_node_address(tmp_path):
    """RUCCL_NODE_ADDRESS=127.0.0.2 (the rendezvous on 127.0.0.1, which alone would give
    127.0.0.1): the group works, every rank's data port is a socket of its own listening
    on 127.0.0.2, and every connection went there, to that port (the INFO log "node r:
    connected to node j at 127.0.0.2:PORT", node j being rank j)."""
    ws = 3
    res = run_workers(ws, w_node_address, free_port(), str(tmp_path),
                      env={"RUCCL_NODE_ADDRESS": "127.0.0.2", "RUCCL_DEBUG": "INFO"})
    for r in range(ws):
        ports, log = res[r]
        assert len(ports) == 1, f"rank {r}: listening on 127.0.0.2 at {ports} (expected its one data port)\n{log}"
        seen = {int(j): (addr, int(p)) for me, j, addr, p in CONNECTED_LOG.findall(log) if int(me) == r}
        expected = {j: ("127.0.0.2", res[j][0][0]) for j in range(r)}
        assert seen == expected, f"rank {r}: connections {seen}, expected {expected}\n{log}"


# --------------------------------------------------------------------------------------
# 3. BAND/BOR on bool; the reduce ops ruccl does not have


def _bools(rank, n, salt):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    # biased so that columns of all-True and of all-False both occur at 3 ranks
    return (torch.rand(n, generator=g) < (0.75 if salt % 2 else 0.25))


def _oracle(columns, op):
    """Per column, the and/or of the ranks' bools, in plain Python."""
    fold = all if op == "BAND" else any
    return torch.tensor([fold(col) for col in zip(*columns)], dtype=torch.bool)


def w_bool_bitwise(rank, ws):
    for op in ("BAND", "BOR"):
        for salt, shape in enumerate([(), (1,), (7,), (3, 5), (70_001,)]):
            n = 1
            for s in shape:
                n *= s
            inputs = [_bools(r, n, salt).tolist() for r in range(ws)]
            expected = _oracle(inputs, op).reshape(shape)
            t = torch.tensor(inputs[rank], dtype=torch.bool).reshape(shape)
            dist.all_reduce(t, op=reduce_op(op))
            assert_equal(t, expected, f"all_reduce {op} bool {shape}")
            for root in range(ws):
                t = torch.tensor(inputs[rank], dtype=torch.bool).reshape(shape)
                dist.reduce(t, dst=root, op=reduce_op(op))
                if rank == root:
                    assert_equal(t, expected, f"reduce {op} bool {shape} root {root}")
        # reduce_scatter_tensor: rank r gets block r of the reduction
        n = 11
        inputs = [_bools(r, n * ws, 7).tolist() for r in range(ws)]
        expected = _oracle(inputs, op)[rank * n:(rank + 1) * n]
        out = sentinel((n,), torch.bool)
        dist.reduce_scatter_tensor(out, torch.tensor(inputs[rank], dtype=torch.bool), op=reduce_op(op))
        assert_equal(out, expected, f"reduce_scatter_tensor {op} bool")
    # the oracle is not degenerate: both outcomes occur for both ops
    both = [_oracle([_bools(r, 70_001, 4).tolist() for r in range(ws)], op) for op in ("BAND", "BOR")]
    assert all(o.any() and not o.all() for o in both)


@pytest.mark.parametrize("ws", [2, 3])
def test_band_bor_on_bool(pools, ws):
    pools.run(ws, w_bool_bitwise)


def _premul_sum():
    return dist._make_nccl_premul_sum(2.0)


C10_NAMES = {torch.float32: "Float", torch.int32: "Int", torch.int64: "Long", torch.uint8: "Byte",
             torch.int8: "Char", torch.bool: "Bool"}
UNSUPPORTED = [  # (op name, dtype)
    ("PREMUL_SUM", torch.int32),
    ("BAND", torch.int32),
    ("BOR", torch.int32),
    ("BXOR", torch.int32),
    ("BAND", torch.int64),
    ("BOR", torch.uint8),
    ("BXOR", torch.int8),
    ("BXOR", torch.bool),
]


def w_unsupported(rank, ws):
    messages = []
    for name, dtype in UNSUPPORTED:
        op = _premul_sum() if name == "PREMUL_SUM" else reduce_op(name)
        calls = {
            "all_reduce": lambda t: dist.all_reduce(t, op=op),
            "reduce": lambda t: dist.reduce(t, dst=ws - 1, op=op),
            "reduce_scatter_tensor": lambda t: dist.reduce_scatter_tensor(torch.empty(2, dtype=dtype), t, op=op),
        }
        for what, call in calls.items():
            t = payload(rank, 0, (2 * ws,), dtype)
            err = None
            try:
                call(t)
            except RuntimeError as e:
                err = str(e)
            assert err is not None, f"rank {rank}: {what} with {name} on {dtype} did not fail"
            assert err.startswith("RUCCL_ERR_UNSUPPORTED"), f"rank {rank}: {what} {name} {dtype}: {err!r}"
            assert f"ReduceOp.{name} on {C10_NAMES[dtype]} tensors" in err, (
                f"rank {rank}: the message does not name the op and the dtype: {err!r}")
            assert_equal(t, payload(rank, 0, (2 * ws,), dtype), f"{what} {name}: input changed by a refused op")
            messages.append(err)
            # the group is still usable, and in step
            _all_reduce_check(rank, ws, f"after {what} {name} {dtype}")
    return messages


@ruccl_specific
@pytest.mark.parametrize("ws", [2, 3])
def test_unsupported_ops_fail_cleanly(pools, ws):
    messages = pools.run(ws, w_unsupported)
    print(*sorted(set(messages[0])), sep="\n")


# --------------------------------------------------------------------------------------
# 4. RUCCL_TRANSPORT=tcp


def _tcp_subset(rank, ws):
    """all_reduce every op on float32 and int32, broadcast, all_gather, reduce_scatter,
    send/recv: exact."""
    shapes = [(), (7,), (3, 4), ((1 << 18) + 3,)]  # the last one: several ring slices
    for dtype_name in ("float32", "int32"):
        dtype = dist_harness.DTYPES[dtype_name]
        for op in dist_harness.OPS:
            if op == "AVG" and not dtype.is_floating_point:
                continue
            for shape in shapes:
                t = reduce_input(rank, ws, shape, dtype, op)
                dist.all_reduce(t, op=reduce_op(op))
                expected = reduce_expected([reduce_input(r, ws, shape, dtype, op) for r in range(ws)], op, ws)
                assert_equal(t, expected, f"tcp all_reduce {op} {dtype_name} {shape}")
        for root in range(ws):
            for shape in shapes:
                t = payload(root, 0, shape, dtype) if rank == root else sentinel(shape, dtype)
                dist.broadcast(t, src=root)
                assert_equal(t, payload(root, 0, shape, dtype), f"tcp broadcast {dtype_name} {shape} root {root}")
        for shape in [(7,), (2, 3), ((1 << 17) + 1,)]:
            outs = [sentinel(shape, dtype) for _ in range(ws)]
            dist.all_gather(outs, payload(rank, 0, shape, dtype))
            for j in range(ws):
                assert_equal(outs[j], payload(j, 0, shape, dtype), f"tcp all_gather {dtype_name} {shape} [{j}]")
            inputs = [reduce_input(rank, ws, shape, dtype, "SUM", salt=j) for j in range(ws)]
            out = sentinel(shape, dtype)
            dist.reduce_scatter(out, inputs)
            expected = reduce_expected([reduce_input(r, ws, shape, dtype, "SUM", salt=rank) for r in range(ws)],
                                       "SUM", ws)
            assert_equal(out, expected, f"tcp reduce_scatter {dtype_name} {shape}")
        for shape in [(5, 3), ((1 << 18) + 7,)]:
            dist_harness.send_recv_every_pair(rank, ws, shape, dtype, f"tcp send/recv {dtype_name}")


def w_tcp(rank, ws, port_tcp, port_shm, directory):
    logs = {}
    os.environ["RUCCL_TRANSPORT"] = "tcp"
    log = os.path.join(directory, f"tcp-{rank}")
    with capture_fd2(log):
        init_pg(rank, ws, f"tcp://127.0.0.1:{port_tcp}")
        _tcp_subset(rank, ws)
        dist.destroy_process_group()
    logs["tcp"] = read(log)
    if not IS_GLOO:  # the control: the same log, same machine, shared memory allowed
        del os.environ["RUCCL_TRANSPORT"]
        log = os.path.join(directory, f"shm-{rank}")
        with capture_fd2(log):
            init_pg(rank, ws, f"tcp://127.0.0.1:{port_shm}")
            _all_reduce_check(rank, ws, "shared memory control")
            dist.destroy_process_group()
        logs["shm"] = read(log)
    return logs


@pytest.mark.parametrize("ws", [2, 3])
def test_tcp_transport(ws, tmp_path):
    """The subset over RUCCL_TRANSPORT=tcp.  TCP was what carried it: with INFO logging
    no rank logged "shared memory with node" (every connection is logged); the control
    session without RUCCL_TRANSPORT, same processes, logs it for every pair."""
    res = run_workers(ws, w_tcp, free_port(), free_port(), str(tmp_path),
                      env={"RUCCL_DEBUG": "INFO"}, timeout=150)
    if IS_GLOO:
        return
    pairs = {(r, j) for r in range(ws) for j in range(r)}
    tcp_connected = {(int(m), int(j)) for r in range(ws) for m, j, _, _ in CONNECTED_LOG.findall(res[r]["tcp"])}
    assert tcp_connected == pairs, f"connections logged over tcp: {tcp_connected}, expected {pairs}"
    for r in range(ws):
        assert SHM_LOG not in res[r]["tcp"], f"rank {r} used shared memory under RUCCL_TRANSPORT=tcp:\n{res[r]['tcp']}"
    shm_pairs = {(int(a), int(b)) for r in range(ws)
                 for a, b in re.findall(r"node (\d+): shared memory with node (\d+)", res[r]["shm"])}
    assert shm_pairs == {(j, r) for r, j in pairs}, (
        f"control without RUCCL_TRANSPORT: shared-memory links {shm_pairs}\n" + "\n".join(x["shm"] for x in res))


# --------------------------------------------------------------------------------------
# 5. a rank killed inside all_reduce


KILL_PG_TIMEOUT = 60.0
KILL_NUMEL = 4 << 20  # 16 MiB of float32: most of each iteration is spent inside the all_reduce
KILL_PROMPT = 10.0  # seconds from the kill to each survivor's error
KILL_LIVENESS_MS = 2000  # RUCCL_LIVENESS_TIMEOUT_MS: how soon a frozen (SIGSTOPped) rank is lost


def _kill_main(rank, ws, port, transport, q):
    dist_harness.prepare_worker()
    if transport == "tcp":
        os.environ["RUCCL_TRANSPORT"] = "tcp"
    os.environ["RUCCL_LIVENESS_TIMEOUT_MS"] = str(KILL_LIVENESS_MS)
    init_pg(rank, ws, f"tcp://127.0.0.1:{port}", timeout=timedelta(seconds=KILL_PG_TIMEOUT))
    t = torch.ones(KILL_NUMEL)
    iterations, msg = 0, None
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            t.fill_(1.0)
            dist.all_reduce(t)
            iterations += 1
            if iterations <= 2:
                assert t[0].item() == ws and t[-1].item() == ws, (t[0].item(), t[-1].item())
            if iterations == 2:  # the loop is under way
                q.put(("looping", rank, time.monotonic()))
        msg = ("finished", rank, time.monotonic(), iterations, None)
    except Exception as e:  # noqa: BLE001
        msg = ("error", rank, time.monotonic(), iterations, f"{type(e).__name__}: {e}")
    q.put(msg)
    q.close()
    q.join_thread()
    os._exit(0)  # no destroy: the group lost a member


@skip_on_gloo("gloo gives the survivors no error for a killed or frozen peer for longer than the group's timeout")
@pytest.mark.parametrize("ws,transport,sig", [(2, "shm", "SIGKILL"), (3, "shm", "SIGKILL"), (3, "tcp", "SIGKILL"),
                                              (2, "shm", "SIGSTOP"), (3, "tcp", "SIGSTOP")])
def test_killed_rank_is_reported_as_peer_lost(ws, transport, sig):
    """All ranks loop over a 16 MiB all_reduce; once every rank has reported the loop
    under way, rank 1 is killed (SIGKILL) or frozen (SIGSTOP: its sockets stay open,
    only its silence tells; the liveness timeout is KILL_LIVENESS_MS).  Every other
    rank gets a RuntimeError with RUCCL_ERR_PEER_LOST within KILL_PROMPT s of the
    signal (the group's timeout: 60 s)."""
    victim = 1
    ctx = torch.multiprocessing.get_context("spawn")
    # A queue per rank: a queue's writers share a lock, which the victim, killed while
    # its feeder thread held it, would keep from the survivors for good.
    queues = [ctx.Queue() for _ in range(ws)]
    port = free_port()
    procs = [ctx.Process(target=_kill_main, args=(r, ws, port, transport, queues[r]), daemon=True)
             for r in range(ws)]

    class _Merged:
        def get(self, timeout):
            until = time.monotonic() + timeout
            while True:
                for one in queues:
                    try:
                        return one.get_nowait()
                    except queue.Empty:
                        pass
                if time.monotonic() >= until:
                    raise queue.Empty
                time.sleep(0.01)

    q = _Merged()
    for p in procs:
        p.start()
    try:
        looping, ended = set(), {}
        deadline = time.monotonic() + 120
        while len(looping) < ws:
            assert time.monotonic() < deadline, f"the loop did not get under way on every rank: {looping}"
            try:
                kind, rank, *rest = q.get(timeout=1)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None]
                assert not dead, f"ranks {dead} ended before the loop was under way"
                continue
            if kind == "looping":
                looping.add(rank)
            else:
                ended[rank] = rest
        assert not ended, f"ranks ended before the kill: {ended}"
        t_kill = time.monotonic()
        os.kill(procs[victim].pid, getattr(signal, sig))
        deadline = t_kill + KILL_PG_TIMEOUT + 30
        while len(ended) < ws - 1:
            assert time.monotonic() < deadline, f"survivors did not all report: {ended}"
            try:
                kind, rank, *rest = q.get(timeout=1)
            except queue.Empty:
                continue
            if kind != "looping":
                ended[rank] = rest
        os.kill(procs[victim].pid, signal.SIGKILL)  # a frozen one too
        procs[victim].join(10)
        assert procs[victim].exitcode == -signal.SIGKILL, procs[victim].exitcode
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
    for r in range(ws):
        if r == victim:
            continue
        t_end, iterations, err = ended[r]
        lag = t_end - t_kill
        print(f"rank {r}: {lag:.2f} s after the kill, {iterations} iterations: {err}")
        assert err is not None, f"rank {r} finished its loop although rank {victim} was killed"
        assert err.startswith("RuntimeError"), f"rank {r}: {err}"
        assert "RUCCL_ERR_PEER_LOST" in err, f"rank {r}: {err}"
        assert 0 <= lag < KILL_PROMPT, f"rank {r}: error {lag:.2f} s after the kill: {err}"
        assert iterations >= 2


# --------------------------------------------------------------------------------------
# 8. the harness reports a failing destroy_process_group


def w_break_destroy(rank, ws):
    if rank == 1:
        real = dist.destroy_process_group

        def failing(*args, **kwargs):
            real(*args, **kwargs)
            raise RuntimeError("destroy_process_group failed on purpose")
        dist.destroy_process_group = failing
    _all_reduce_check(rank, ws, "before the broken destroy")


def test_pool_close_reports_a_failing_destroy():
    pool = WorkerPool(2, init_method="env://", env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    try:
        pool.run(w_break_destroy)
    except BaseException:
        pool.kill()
        raise
    with pytest.raises(AssertionError) as info:
        pool.close()
    text = str(info.value)
    assert "rank 1" in text and "destroy_process_group failed on purpose" in text, text
    assert "--- rank 0" not in text, text
