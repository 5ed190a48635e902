"""torchrun (python -m torch.distributed.run) launching torchrun_check.py: one node with
2 and 3 workers, and two "nodes" (two launchers on 127.0.0.1, 2 workers each)."""

import os
import re
import signal
import subprocess
import sys

import pytest

from dist_harness import child_env, free_port

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_check.py")
LAUNCH_TIMEOUT = 150


def _start(args, world_size):
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, SCRIPT]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env({"RUCCL_EXPECT_WORLD_SIZE": str(world_size)}),
        start_new_session=True,  # its own process group: a hang is killed with all its workers
    )


def _finish(procs):
    """Waits for every launcher; returns [(returncode, output)].  On a timeout kills the
    launchers' process groups (their workers included) and fails."""
    results, timed_out = [], False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            out, _ = p.communicate()
        results.append((p.returncode, out))
    if timed_out:
        pytest.fail("torchrun did not finish in %d s:\n%s" % (LAUNCH_TIMEOUT, "\n".join(o[-3000:] for _, o in results)))
    return results


def _ok_ranks(output):
    # workers share the launcher's stdout: their lines may run together
    return sorted(int(r) for r in re.findall(r"torchrun_check OK rank (\d+)/\d+", output))


@pytest.mark.parametrize("nproc", [2, 3])
def test_torchrun_single_node(nproc):
    [(rc, out)] = _finish([_start(["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc)], nproc)])
    assert rc == 0, f"torchrun exited {rc}:\n{out[-6000:]}"
    assert _ok_ranks(out) == list(range(nproc)), out[-6000:]


def test_torchrun_two_nodes():
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(port), "--rdzv-backend", "static"]
    procs = [_start(common + ["--node-rank", str(n)], 4) for n in (0, 1)]
    results = _finish(procs)
    for n, (rc, out) in enumerate(results):
        assert rc == 0, f"node {n}: torchrun exited {rc}:\n{out[-6000:]}"
    # node 0 runs global ranks 0, 1; node 1 runs 2, 3
    assert _ok_ranks(results[0][1]) == [0, 1], results[0][1][-6000:]
    assert _ok_ranks(results[1][1]) == [2, 3], results[1][1][-6000:]
