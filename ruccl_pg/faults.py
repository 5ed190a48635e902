"""Named fault points: a test hook that kills (or freezes) this process at a chosen
moment of a training run, so that a test of "killed there, restarted, bit-identical"
is deterministic.  Not for production use; nothing happens unless RUCCL_FAULT is set.

    RUCCL_FAULT=POINT:N[:RANK[:kill|stop]][@RUN][,...]

fires the N-th time (1-based) this process reaches POINT, on the rank RANK only (of the
default process group, else the RANK environment variable; every rank when omitted):
``kill`` (default) is SIGKILL, ``stop`` is SIGSTOP.  It fires only in the job's run RUN
(torchrun's TORCHELASTIC_RESTART_COUNT; 0, the first run, by default), so the restarted
job runs through; several faults, separated by commas, may name different runs (a kill
in run 0, then one during run 1's load).

The points ruccl_pg itself reaches:

    collective     all_reduce_gradients, after its reductions are issued and before the
                   first is waited for: the process dies inside the collective
    save-files     TrainingRecord's save, once every rank's file is written and before
                   rank 0 writes the manifest
    load           TrainingRecord.load, after this rank read and checked its file and
                   before the ranks agree to apply it

A program may add its own with ``fault_point(name)`` (the example trainer: ``backward``,
inside the backward pass).
"""
import os
import signal

__all__ = ["fault_point", "POINTS"]

POINTS = ("collective", "save-files", "load", "backward")

_counts = {}
_specs = None


def _parse_one(text):
    spec, _, run = text.partition("@")
    parts = spec.split(":")
    if len(parts) < 2 or len(parts) > 4 or not parts[0]:
        raise ValueError(f"RUCCL_FAULT: {text!r}: expected POINT:N[:RANK[:kill|stop]][@RUN]")
    point = parts[0]
    try:
        nth = int(parts[1])
        rank = int(parts[2]) if len(parts) > 2 and parts[2] != "" else None
        run = int(run) if run else 0
    except ValueError:
        raise ValueError(f"RUCCL_FAULT: {text!r}: N, RANK and RUN must be integers") from None
    how = parts[3] if len(parts) > 3 else "kill"
    if nth < 1:
        raise ValueError(f"RUCCL_FAULT: {text!r}: N counts from 1")
    if how not in ("kill", "stop"):
        raise ValueError(f"RUCCL_FAULT: {text!r}: the fault is 'kill' or 'stop', not {how!r}")
    return point, nth, rank, how, run


def parse(text):
    """The faults RUCCL_FAULT's text names, as (point, n, rank, how, run) tuples."""
    return [_parse_one(t.strip()) for t in text.split(",") if t.strip()]


def _armed():
    global _specs
    if _specs is None:
        run = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        _specs = [s for s in parse(os.environ.get("RUCCL_FAULT", "")) if s[4] == run]
    return _specs


def _my_rank():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "-1"))


def fault_point(name):
    """Counts this process's arrival at the point ``name`` and, when RUCCL_FAULT names
    this arrival, kills or stops the process here (see the module's doc)."""
    specs = _armed()
    if not specs:
        return
    _counts[name] = _counts.get(name, 0) + 1
    for point, nth, rank, how, _ in specs:
        if point != name or _counts[name] != nth or (rank is not None and _my_rank() != rank):
            continue
        os.write(2, f"RUCCL_FAULT: {how} at {name} #{nth} (pid {os.getpid()})\n".encode())
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
