"""dist.shrink_group on ruccl (tests/python/shrink_job.py): 4 ranks lose one and go on.

After a kill -9 or a SIGSTOP of rank 3 in the middle of a DDP step, the survivors get
the error, shrink the default group without rank 3, and take DDP steps over the three
of them, which must end where a fresh 3-rank group from the same state ends, exactly.
SHRINK_ABORT ends an all-reduce the survivors are blocked in.  gloo refuses shrinking
(TypeError), so this is beyond gloo.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

from dist_harness import HERE, IS_GLOO, child_env, free_port

pytestmark = pytest.mark.skipif(IS_GLOO, reason="RUCCL_PY_BACKEND=gloo: gloo cannot shrink")

JOB = os.path.join(HERE, "shrink_job.py")


def _run(scenario, out_dir, world, extra=None, victim=None, timeout=120):
    os.makedirs(out_dir, exist_ok=True)
    port = str(free_port())
    procs = []
    for r in range(world):
        env = child_env({"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         **(extra or {})})
        procs.append(subprocess.Popen([sys.executable, JOB, scenario, str(out_dir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    codes, errs = [], []
    for r, p in enumerate(procs):
        if r == victim:
            continue
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank {r} did not exit in {timeout} s")
        codes.append(p.returncode)
        errs.append(err)
    if victim is not None:
        procs[victim].kill()
        procs[victim].communicate()
    assert codes == [0] * len(codes), "\n".join(e[-2500:] for e in errs)
    out = {}
    for name in os.listdir(out_dir):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(out_dir, name)) as f:
                d = json.load(f)
            out[d["rank"]] = d
    return out, errs


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_shrink_group_after_a_lost_rank_then_ddp_matches_a_fresh_group(tmp_path, fault):
    shrunk, errs = _run(fault, tmp_path / "shrunk", 4, {"RUCCL_LIVENESS_TIMEOUT_MS": "2000"}, victim=3)
    assert sorted(shrunk) == [0, 1, 2], shrunk.keys()
    for r, d in shrunk.items():
        assert d["old_rank"] == r and d["size"] == 3, d
        assert "RUCCL_ERR_PEER_LOST" in d["failed"], d["failed"]
    fresh, _ = _run("fresh", tmp_path / "fresh", 3)
    for r in range(3):
        assert shrunk[r]["params"] == shrunk[0]["params"], "the survivors' models differ"
        assert fresh[r]["params"] == shrunk[r]["params"], f"rank {r}: the shrunk group's steps differ from a fresh group's"
        assert fresh[r]["fsdp2"] == shrunk[r]["fsdp2"], f"rank {r}: FSDP2 over the shrunk group differs from a fresh group"


def test_shrink_abort_ends_a_blocked_all_reduce_and_the_three_go_on(tmp_path):
    out, _ = _run("abort", tmp_path, 4)
    assert sorted(out) == [0, 1, 2]
    for r, d in out.items():
        assert d["size"] == 3 and d["sum"] == 6.0, d
        assert "RUCCL_ERR_REVOKED" in d["failed"], d["failed"]
        assert d["shrink_s"] < 5.0, d["shrink_s"]


def test_shutdown_and_abort_with_a_dead_peer_take_under_a_second(tmp_path):
    out, _ = _run("deadpeer", tmp_path, 3, victim=2)
    assert sorted(out) == [0, 1]
    for r, d in out.items():
        assert "RUCCL_ERR_PEER_LOST" in d["failed"], d
        assert d["took"] < 1.0, f"rank {r}: {d['how']} took {d['took']:.2f} s"
