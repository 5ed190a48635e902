"""ruccl_pg — ruCCL as a torch.distributed backend.

    import ruccl_pg                      # registers the backend "ruccl" (cpu and cuda)
    torch.distributed.init_process_group("ruccl")

CUDA tensors are taken by the core as they are when the extension was built with
CUDA (ruccl_pg.built_with_cuda(); setup.py does so when torch has CUDA and nvcc is
found), else they are copied through host memory; either way the collectives follow
the caller's current CUDA streams.

Each process is one ruCCL node; the nodes rendezvous through the store torch hands
the backend (env://, tcp://, file://), so no extra server runs.  This node's data
address is RUCCL_NODE_ADDRESS when set, else the local address that routes toward
the rendezvous host (MASTER_ADDR, or the TCPStore's host), else 127.0.0.1.

Collective training (ruccl_pg.training): all_reduce_gradients(model) between
backward() and optimizer.step(), and TrainingRecord, a collective atomic checkpoint;
ResumableDistributedSampler (ruccl_pg.data), whose position a TrainingRecord saves.
"""
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C
from .data import ResumableDistributedSampler
from .faults import fault_point
from .training import TrainingRecord, all_reduce_gradients, parameter_fingerprint

__all__ = ["ProcessGroupRuccl", "node_address", "version", "built_with_cuda", "all_reduce_gradients",
           "parameter_fingerprint", "TrainingRecord", "ResumableDistributedSampler", "fault_point", "dump_trace"]

ProcessGroupRuccl = _C.ProcessGroupRuccl
version = _C.version
built_with_cuda = _C.built_with_cuda  # CUDA tensors go to the core as they are (else through host copies)


def dump_trace(directory=None) -> str:
    """Writes this process's flight recorder (its last RUCCL_TRACE_BUFFER collectives and
    point-to-point calls, over every ruccl group) to ``directory`` (default:
    RUCCL_TRACE_DIR) as ``ruccl_trace_rank_<rank>.json``; returns the file's path.
    ``python -m ruccl_pg.trace DIR`` reads the files of every rank."""
    return _C.dump_trace(os.fspath(directory) if directory is not None else "", "dump_trace()")


def _store_host(store):
    """The host of the TCPStore behind torch's prefix stores, if that is what it is."""
    for _ in range(16):
        if isinstance(store, dist.TCPStore):
            return store.host
        inner = getattr(store, "underlying_store", None)
        if inner is None:
            return None
        store = inner
    return None


def node_address(store=None) -> str:
    """The address other nodes reach this process's data service on: RUCCL_NODE_ADDRESS,
    else the local address that routes toward the rendezvous host (MASTER_ADDR, or the
    TCPStore's host), else 127.0.0.1."""
    explicit = os.environ.get("RUCCL_NODE_ADDRESS")
    if explicit:
        return explicit
    for host in (os.environ.get("MASTER_ADDR"), _store_host(store)):
        if not host or host in ("localhost", "127.0.0.1", "::1"):
            continue
        try:  # no packet is sent: connect() on UDP only picks the route
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((host, 9))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


def _create(dist_opts, backend_opts=None):
    timeout = dist_opts.timeout if isinstance(dist_opts.timeout, timedelta) else timedelta(minutes=30)
    return _C.create_backend(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        timeout,
        str(dist_opts.group_id),
        node_address(dist_opts.store),
    )


if "ruccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("ruccl", _create, extended_api=True, devices=["cpu", "cuda"])
