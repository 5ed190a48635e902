"""Process harness and value helpers for the torch-backend tests.

Imported by the test modules (``conftest.py`` puts this directory on ``sys.path``) and,
inside every worker process, by the workers themselves.

Backend under test: ``RUCCL_PY_BACKEND`` (default ``ruccl``).  For ``ruccl`` each
worker imports ``ruccl_pg`` (which registers the backend) before it initialises a
process group.

Workers are real processes started with the ``spawn`` method.  A worker runs tasks:
a module-level function ``fn(rank, world_size, *args)`` named by its file and
name (so the test modules need not be importable under pytest's own module names).
A task fails when ``fn`` raises on any rank; the traceback of every failing rank is
reported.  A task that does not finish in time fails too: the workers' Python stacks
are dumped (faulthandler, to the captured stderr) and the workers are killed.

Return values travel through a multiprocessing queue: return plain Python values
(lists, numbers, strings), never tensors (torch would share their storage through
file descriptors that die with the worker).
"""

import faulthandler
import importlib
import os
import queue
import signal
import socket
import sys
import time
import traceback
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

BACKEND = os.environ.get("RUCCL_PY_BACKEND", "").strip() or "ruccl"
IS_GLOO = BACKEND == "gloo"

PG_TIMEOUT = timedelta(seconds=60)  # every init_process_group of these tests
TASK_TIMEOUT = 90.0  # seconds one task may take on all ranks together
START_TIMEOUT = 120.0  # seconds for workers to start (import torch, init)
ERROR_GRACE = 10.0  # after the first rank failed, how long to wait for the others

HERE = os.path.dirname(os.path.abspath(__file__))


def skip_on_gloo(reason):
    """Skips a test only when the backend under test is gloo, saying why."""
    return pytest.mark.skipif(IS_GLOO, reason=f"RUCCL_PY_BACKEND=gloo: {reason}")


# Tests of ruccl's own error reporting (RUCCL_ERR_* messages): gloo has nothing like it.
ruccl_specific = skip_on_gloo("ruccl-specific check (RUCCL_ERR_* error names), gloo does not have them")


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(extra=None):
    """Environment for a subprocess (torchrun) that sees the modules this process sees:
    PYTHONPATH carries this interpreter's sys.path ('' as the current directory), so
    that ``import ruccl_pg`` resolves there as it does here and in spawned workers."""
    env = dict(os.environ)
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env["RUCCL_PY_BACKEND"] = BACKEND
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


# --------------------------------------------------------------------------------------
# Worker side


def prepare_worker():
    """Per-process setup of a worker: quiet deprecations, one thread (2-core machines),
    and the backend's registration."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)
    if BACKEND == "ruccl":
        import ruccl_pg  # noqa: F401  (registers the "ruccl" backend)


def init_pg(rank, world_size, init_method, timeout=PG_TIMEOUT, backend=None):
    dist.init_process_group(
        backend=backend or BACKEND,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    assert dist.is_initialized()
    assert dist.get_rank() == rank, (dist.get_rank(), rank)
    assert dist.get_world_size() == world_size, (dist.get_world_size(), world_size)
    assert dist.get_backend() == (backend or BACKEND), dist.get_backend()


def _resolve(spec):
    directory, module, name = spec
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return getattr(importlib.import_module(module), name)


def _worker_main(rank, world_size, init_method, env, task_q, result_q):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ.update(env or {})
    try:
        prepare_worker()
        if init_method is not None:
            init_pg(rank, world_size, init_method)
        result_q.put((rank, 0, "ok", None))
    except BaseException:
        result_q.put((rank, 0, "error", traceback.format_exc()))
        return
    while True:
        task = task_q.get()
        if task is None:
            break
        seq, spec, args = task
        try:
            value = _resolve(spec)(rank, world_size, *args)
            result_q.put((rank, seq, "ok", value))
        except BaseException:
            result_q.put((rank, seq, "error", traceback.format_exc()))
    if init_method is not None and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except BaseException:
            result_q.put((rank, -1, "error", "destroy_process_group failed:\n" + traceback.format_exc()))
            return
    result_q.put((rank, -1, "ok", None))


# --------------------------------------------------------------------------------------
# Parent side


class WorkerPool:
    """``world_size`` spawned worker processes.  With ``init_method`` each initialises
    the default process group once (backend under test) and keeps it across tasks;
    with None the tasks initialise (and destroy) their own groups.

    After any failed task the pool is marked broken and killed: its group may be out
    of step.  ``Pools`` (conftest) replaces a broken pool for the next test."""

    def __init__(self, world_size, init_method=None, env=None, start_timeout=START_TIMEOUT):
        ctx = torch.multiprocessing.get_context("spawn")
        self.world_size = world_size
        self.broken = False
        self._seq = 0
        self._result_q = ctx.Queue()
        self._task_qs = [ctx.Queue() for _ in range(world_size)]
        self._procs = [
            ctx.Process(
                target=_worker_main,
                args=(r, world_size, init_method, env, self._task_qs[r], self._result_q),
                name=f"ruccl-test-rank{r}",
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self._collect(0, start_timeout, what=f"start of {world_size} workers (init {init_method})")

    def run(self, fn, *args, timeout=TASK_TIMEOUT):
        """Runs ``fn(rank, world_size, *args)`` on every worker; returns the per-rank
        results as a list, or raises AssertionError naming every rank's failure."""
        if self.broken:
            raise AssertionError("worker pool is broken by an earlier failure")
        self._seq += 1
        spec = (os.path.dirname(os.path.abspath(fn.__code__.co_filename)),
                os.path.splitext(os.path.basename(fn.__code__.co_filename))[0], fn.__name__)
        for q in self._task_qs:
            q.put((self._seq, spec, args))
        return self._collect(self._seq, timeout, what=f"{fn.__name__}{args!r}")

    def _collect(self, seq, timeout, what):
        results, errors = {}, {}
        deadline = time.monotonic() + timeout
        timed_out = False
        while len(results) + len(errors) < self.world_size:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            try:
                rank, got_seq, status, value = self._result_q.get(timeout=min(0.5, deadline - now))
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs)
                        if p.exitcode is not None and r not in results and r not in errors]
                for r in dead:
                    errors[r] = f"worker process died (exit code {self._procs[r].exitcode})"
                continue
            if got_seq != seq:
                continue
            if status == "ok":
                results[rank] = value
            else:
                errors[rank] = value
                # the others may be stuck in a collective with the failed rank
                deadline = min(deadline, time.monotonic() + ERROR_GRACE)
        if not errors and not timed_out:
            return [results[r] for r in range(self.world_size)]
        self.broken = True
        missing = [r for r in range(self.world_size) if r not in results and r not in errors]
        if missing:
            self._dump_stacks(missing)
        self.kill()
        lines = [f"{what} failed on {self.world_size} ranks (backend {BACKEND}):"]
        for r in range(self.world_size):
            if r in errors:
                lines.append(f"--- rank {r}: {errors[r]}")
            elif r in missing:
                lines.append(f"--- rank {r}: no result in time (stacks dumped to stderr)")
        raise AssertionError("\n".join(lines))

    def _dump_stacks(self, ranks):
        for r in ranks:
            p = self._procs[r]
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except OSError:
                    pass
        time.sleep(1.0)

    def kill(self):
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)

    def close(self, timeout=30.0):
        """Ends the workers.  A pool that is not broken first shuts down in order (each
        worker destroys the group it initialised): a failure or a hang there is raised
        (AssertionError naming the ranks), after the workers are killed."""
        try:
            if not self.broken:
                for q in self._task_qs:
                    q.put(None)
                self._collect(-1, timeout, what="shutdown (destroy_process_group)")
        finally:
            self.kill()


def run_workers(world_size, fn, *args, timeout=TASK_TIMEOUT, env=None):
    """One-shot: spawns fresh workers that do not initialise anything, runs ``fn`` on
    them (it does its own init_process_group), and ends them."""
    pool = WorkerPool(world_size, init_method=None, env=env)
    try:
        return pool.run(fn, *args, timeout=timeout)
    finally:
        pool.close()


# --------------------------------------------------------------------------------------
# Values: small integers, exact in every dtype under test


DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
# AVG is for floating dtypes only.
DTYPE_OPS = [(d, o) for d in DTYPES for o in OPS if o != "AVG" or d in FLOAT_DTYPES]


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def reduce_input(rank, world_size, shape, dtype, op, salt=0):
    """Rank ``rank``'s input to a reduction with ``op``; ``salt`` varies it (the chunks of
    a reduce-scatter).  Sums stay within [-15, 30], products within [-27, 27]."""
    i = torch.arange(numel(shape), dtype=torch.int64) + 5 * salt
    if dtype == torch.bool:
        v = (i % (rank + 2)) != 1  # mixed True/False, some all-True columns
        return v.reshape(shape)
    signed = dtype != torch.uint8
    if op == "PRODUCT":
        table = torch.tensor([1, 2, -1, 3] if signed else [1, 2, 3, 1])
        v = table[(i + 2 * rank) % 4]
    else:
        v = (i * 7 + rank * 3) % 11
        if signed:
            v = v - 5
        if op == "AVG":
            v = v * world_size  # the mean is then the (exact) sum of the small values
    return v.to(dtype).reshape(shape)


def reduce_expected(inputs, op, world_size):
    """The reduction of the ranks' ``inputs`` under ``op`` (bool: SUM/MAX = or, PRODUCT/MIN = and)."""
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        if op in ("SUM", "MAX"):
            return stack.any(0)
        if op in ("PRODUCT", "MIN"):
            return stack.all(0)
        raise ValueError(op)
    wide = torch.stack([x.to(torch.float64 if dtype.is_floating_point else torch.int64) for x in inputs])
    if op == "SUM":
        r = wide.sum(0)
    elif op == "AVG":
        r = wide.sum(0) / world_size
    elif op == "PRODUCT":
        r = wide.prod(0)
    elif op == "MIN":
        r = wide.min(0).values
    elif op == "MAX":
        r = wide.max(0).values
    else:
        raise ValueError(op)
    return r.to(dtype)


def payload(src, dst, shape, dtype):
    """Data that ``src`` sends towards ``dst`` (0 for data meant for everyone)."""
    v = (src * 7 + dst * 3 + torch.arange(numel(shape), dtype=torch.int64)) % 100
    if dtype == torch.bool:
        v = v % 2 == 1
    return v.to(dtype).reshape(shape)


def sentinel(shape, dtype):
    """An output buffer's prior contents: differs from ``payload`` somewhere."""
    return torch.full(shape, True if dtype == torch.bool else 77, dtype=dtype)


def assert_equal(actual, expected, what):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not torch.equal(actual, expected):
        raise AssertionError(f"{what} (rank {dist.get_rank() if dist.is_initialized() else '?'}):\n"
                             f"  got      {actual.flatten().tolist()}\n  expected {expected.flatten().tolist()}")


def reduce_op(name):
    return getattr(dist.ReduceOp, name)


def send_recv_every_pair(rank, ws, shape, dtype, what):
    """Every ordered pair (s, d) exchanges payload(s, d), one pair at a time in the same
    order on every rank; each receiver checks the source it is told and the bytes."""
    for s in range(ws):
        for d in range(ws):
            if s == d:
                continue
            if rank == s:
                dist.send(payload(s, d, shape, dtype), dst=d)
            elif rank == d:
                t = sentinel(shape, dtype)
                src = dist.recv(t, src=s)
                assert src == s, (src, s)
                assert_equal(t, payload(s, d, shape, dtype), f"{what} {tuple(shape)} {s}->{d}")
