"""ruccl under torchft: a reconfigurable process group in the shape of torchft's own.

    from ruccl_pg.torchft import ProcessGroupRuccl
    pg = ProcessGroupRuccl(timeout=timedelta(seconds=10))
    manager = torchft.Manager(pg=pg, ...)

torchft (``pip install torchft==0.2.0``) keeps replica groups training while one of
them restarts: its Manager calls ``configure`` with a new store address for every
quorum, and this class makes a fresh ruccl backend on that store each time (the old one
aborted first).  Every collective torchft runs is supported, ``reduce_scatter`` and
``reduce_scatter_tensor_coalesced`` included (torchft's gloo wrapper refuses both).
``errored()`` returns the first error a collective of the current group ended with (a
ruccl error: ``RUCCL_ERR_PEER_LOST: ...`` when a replica died), or the abort; the next
``configure`` starts clean.  Ranks may be threads of one process (torchft's tests).
"""
import threading
from datetime import timedelta
from typing import Optional

import torch

try:
    from torchft.process_group import ProcessGroupWrapper
except ImportError as e:  # optional dependency
    raise ImportError("ruccl_pg.torchft needs torchft (pip install torchft==0.2.0)") from e

from torch.distributed import ProcessGroup as BaseProcessGroup

from . import _C, node_address

__all__ = ["ProcessGroupRuccl"]


class ProcessGroupRuccl(ProcessGroupWrapper):
    """A torchft ProcessGroupWrapper whose groups are ruccl backends."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._errored: Optional[Exception] = None
        self._error_lock = threading.Lock()
        self._store_addr = ""

    def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int, quorum_id=None,
                  group_rank=None, group_world_size=None, global_ranks=None) -> None:
        self._store_addr = store_addr
        super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size,
                          global_ranks)

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        with self._error_lock:
            self._errored = None
        # the same on every rank of this quorum (torchft gives each quorum its own store
        # prefix), and another for the next: the group's name in the core and the store
        group_id = "torchft:" + self._store_addr.split("/", 1)[-1]
        backend = _C.create_backend(store, rank, world_size, self._timeout, group_id, node_address(store))
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), BaseProcessGroup.BackendType.CUSTOM, backend)
        self._backend = backend
        return pg

    def getBackendName(self) -> str:
        return "torchft-ruccl"

    def _note(self, error: Exception) -> None:
        with self._error_lock:
            if self._errored is None:
                self._errored = error

    def _wrap_work(self, work, opts):
        def seen(fut):
            try:
                fut.value()
            except Exception as e:  # noqa: BLE001  the collective's error, for errored()
                self._note(e)

        work.get_future().add_done_callback(seen)
        return work

    def abort(self, errored: bool = True) -> None:
        if errored:
            self._note(RuntimeError("RUCCL_ERR_ABORTED: the process group was aborted"))
        super().abort(errored=errored)
        self._backend = None

    def shutdown(self) -> None:
        backend = getattr(self, "_backend", None)
        if backend is not None:
            backend.shutdown()  # this rank's session ends: its peers see it finished
        self._backend = None
        super().shutdown()

    def errored(self) -> Optional[Exception]:
        with self._error_lock:
            return self._errored

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        backend = getattr(self, "_backend", None)
        if backend is not None:
            backend._set_default_timeout(timeout)
