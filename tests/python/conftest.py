"""pytest setup for the torch-backend tests (see dist_harness.py).

    RUCCL_PY_BACKEND=gloo python3 -m pytest tests/python -q     # the harness, on gloo
    python3 -m pytest tests/python -q                           # the ruccl backend
"""

import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dist_harness import BACKEND, WorkerPool, free_port  # noqa: E402


def pytest_configure(config):
    if BACKEND == "ruccl" and importlib.util.find_spec("ruccl_pg") is None:
        raise pytest.UsageError(
            "RUCCL_PY_BACKEND=ruccl (the default) but there is no importable ruccl_pg: build the "
            "extension (or run with RUCCL_PY_BACKEND=gloo to check the tests themselves)")
    # Always list skipped tests with their reasons (ruccl-specific checks skip on gloo).
    chars = getattr(config.option, "reportchars", "") or ""
    if "s" not in chars and "a" not in chars and "A" not in chars:
        config.option.reportchars = chars + "s"


def pytest_report_header(config):
    return f"torch backend under test (RUCCL_PY_BACKEND): {BACKEND}"


class Pools:
    """One live worker pool per world size, each with the default process group of the
    backend under test initialised (env://, 127.0.0.1, a free port).  Many tests share
    a pool, so that the suite pays for few process starts; a pool that a failure broke
    is replaced on the next use."""

    def __init__(self):
        self._pools = {}
        self._start_failure = {}  # world size -> error: do not retry for every test

    def get(self, world_size):
        if world_size in self._start_failure:
            raise AssertionError(f"the {world_size}-rank worker pool failed to start earlier:\n"
                                 f"{self._start_failure[world_size]}")
        pool = self._pools.get(world_size)
        if pool is not None and not pool.broken:
            return pool
        if pool is not None:
            pool.kill()
        last = None
        for _attempt in range(2):  # a free port can be taken between lookup and bind
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
            try:
                pool = WorkerPool(world_size, init_method="env://", env=env)
                break
            except AssertionError as e:
                last = e
        else:
            self._start_failure[world_size] = str(last)
            raise last
        self._pools[world_size] = pool
        return pool

    def run(self, world_size, fn, *args, **kwargs):
        return self.get(world_size).run(fn, *args, **kwargs)

    def close(self):
        """Closes every pool, then raises the first pool's shutdown failure, if any."""
        failures = []
        for ws, pool in sorted(self._pools.items()):
            try:
                pool.close()
            except AssertionError as e:
                failures.append(f"the {ws}-rank pool: {e}")
        self._pools.clear()
        if failures:
            raise AssertionError("\n".join(failures))


@pytest.fixture(scope="session")
def pools():
    p = Pools()
    yield p
    p.close()
