"""ruccl_pg — ruCCL as a torch.distributed backend.

    import ruccl_pg                      # registers the backend "ruccl" (cpu and cuda)
    torch.distributed.init_process_group("ruccl")

Each process is one ruCCL node; the nodes rendezvous through the store torch hands
the backend (env://, tcp://, file://), so no extra server runs.  This node's data
address is RUCCL_NODE_ADDRESS when set, else the local address that routes toward
MASTER_ADDR, else 127.0.0.1.
"""
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C

__all__ = ["ProcessGroupRuccl", "node_address", "version"]

ProcessGroupRuccl = _C.ProcessGroupRuccl
version = _C.version


def node_address() -> str:
    """The address other nodes reach this process's data service on."""
    explicit = os.environ.get("RUCCL_NODE_ADDRESS")
    if explicit:
        return explicit
    master = os.environ.get("MASTER_ADDR")
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        try:  # no packet is sent: connect() on UDP only picks the route
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
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
        node_address(),
    )


if "ruccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("ruccl", _create, extended_api=True, devices=["cpu", "cuda"])
