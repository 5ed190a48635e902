"""The flight recorder, on real failures of a 3-rank job (tests/python/trace_job.py).

Each job writes its ranks' traces to RUCCL_TRACE_DIR by itself, on the error (or, for a
rank hung in Python, on SIGUSR1 from the test); ``python -m ruccl_pg.trace DIR`` must then
name the rank that went wrong: the one that skipped a collective, the one that called
another shape, the one that was killed, the one that froze.  Also: the dump's contents
for a run that went right (ruccl_pg.dump_trace()), the ring's size, and a bad
RUCCL_TRACE_BUFFER.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from dist_harness import HERE, IS_GLOO, child_env, free_port

pytestmark = pytest.mark.skipif(IS_GLOO, reason="RUCCL_PY_BACKEND=gloo: the flight recorder is ruccl's")

JOB = os.path.join(HERE, "trace_job.py")
WORLD = 3


def _start(scenario, trace_dir, extra=None):
    port = str(free_port())
    procs = []
    for r in range(WORLD):
        env = child_env({"RANK": str(r), "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                         "RUCCL_TRACE_DIR": str(trace_dir), **(extra or {})})
        procs.append(subprocess.Popen([sys.executable, JOB, scenario], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def _wait(p, timeout=120):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"a rank did not exit in {timeout} s:\n{err[-2000:]}")
    return p.returncode, out, err


def _analyse(trace_dir):
    r = subprocess.run([sys.executable, "-m", "ruccl_pg.trace", str(trace_dir), "--json"], env=child_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    lines = r.stdout.strip().splitlines()
    return "\n".join(lines[:-1]), json.loads(lines[-1])


def _trace(trace_dir, rank):
    with open(os.path.join(trace_dir, f"ruccl_trace_rank_{rank}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("scenario,culprit,errors", [
    ("skip", 1, "RUCCL_ERR_"),
    ("shape", 2, "RUCCL_ERR_SHAPE_MISMATCH"),
    ("kill", 2, "RUCCL_ERR_PEER_LOST"),
])
def test_the_analyser_names_the_rank_that_went_wrong(tmp_path, scenario, culprit, errors):
    procs = _start(scenario, tmp_path)
    results = [_wait(p) for p in procs]
    for r, (rc, _out, err) in enumerate(results):
        if scenario == "kill" and r == culprit:
            assert rc == -signal.SIGKILL, (rc, err[-2000:])
            continue
        assert rc == 3, f"rank {r}: exit {rc}, expected the collective's error\n{err[-2000:]}"
        assert errors in err, err[-2000:]
    # every rank that lived wrote its trace by itself, on its error
    for r in range(WORLD):
        path = os.path.join(tmp_path, f"ruccl_trace_rank_{r}.json")
        assert os.path.exists(path) != (scenario == "kill" and r == culprit), sorted(os.listdir(tmp_path))
    t0 = _trace(tmp_path, 0)
    assert t0["reason"].startswith("error: RUCCL_ERR_"), t0["reason"]
    last = t0["entries"][-1]
    assert (last["seq"], last["state"]) == (4, "error"), last  # numbered from 0, as the core does
    assert [e["kind"] for e in t0["entries"][:4]] == ["all_reduce"] * 3 + ["broadcast"]
    assert all(e["state"] == "done" for e in t0["entries"][:4])
    report, verdict = _analyse(tmp_path)
    assert verdict["culprits"] == {"0": [culprit]}, report
    assert not verdict["ok"]
    assert f"culprit: rank {culprit}" in report, report
    assert "last completed collective: rank 0 #3" in report, report
    if scenario == "skip":
        assert "collective #4: rank 1 called broadcast" in report and "ranks 0, 2 called all_reduce" in report, report
    if scenario == "shape":
        assert "rank 2 called all_reduce Float[5]" in report, report
    if scenario == "kill":
        assert "none from rank 2" in report and "left no trace" in report, report


def test_a_frozen_rank_dumps_on_sigusr1_and_is_named(tmp_path):
    procs = _start("freeze", tmp_path, {"PG_TIMEOUT": "3"})
    frozen = procs[2]
    try:
        for r in (0, 1):
            rc, _out, err = _wait(procs[r])
            assert rc == 3 and "RUCCL_ERR_TIMEOUT" in err, (r, rc, err[-2000:])
        assert not os.path.exists(os.path.join(tmp_path, "ruccl_trace_rank_2.json"))
        assert frozen.poll() is None, "the frozen rank exited"
        frozen.send_signal(signal.SIGUSR1)  # what a user does to a rank that hangs
        path = os.path.join(tmp_path, "ruccl_trace_rank_2.json")
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.path.exists(path), "SIGUSR1 wrote no trace"
        assert frozen.poll() is None, "SIGUSR1 killed the rank"
    finally:
        frozen.kill()
        frozen.communicate()
    t2 = _trace(tmp_path, 2)
    assert t2["reason"] == "SIGUSR1"
    assert [e["state"] for e in t2["entries"]] == ["done"] * 4
    report, verdict = _analyse(tmp_path)
    assert verdict["culprits"] == {"0": [2]}, report
    assert "rank 2 never called it" in report, report
    assert "RUCCL_ERR_TIMEOUT" in report, report


def w_dump_contents(rank, ws, directory):
    import torch
    import ruccl_pg
    t = torch.ones(3, 2)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    dist.broadcast(t, src=1)
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
    dist.barrier()
    path = ruccl_pg.dump_trace(directory)
    with open(path) as f:
        d = json.load(f)
    return path, d


def test_dump_trace_writes_what_each_rank_did(pools, tmp_path):
    results = pools.run(2, w_dump_contents, str(tmp_path))
    for rank, (path, d) in enumerate(results):
        assert path == os.path.join(str(tmp_path), f"ruccl_trace_rank_{rank}.json")
        assert d["rank"] == rank and d["reason"] == "dump_trace()" and d["capacity"] == 2000
        mine = [e for e in d["entries"] if d["groups"][e["group"]]["size"] == 2 and not e["p2p"]][-3:]
        assert [(e["kind"], e["op"], e["root"]) for e in mine] == [
            ("all_reduce", "MAX", -1), ("broadcast", None, 1), ("barrier", None, -1)], mine
        assert mine[0]["dtype"] == "Float" and mine[0]["shape"] == [3, 2]
        assert all(e["state"] == "done" and e["algorithm"] for e in mine), mine
        assert all(e["issued_ns"] <= e["started_ns"] <= e["finished_ns"] for e in mine), mine
        assert mine[0]["seq"] + 1 == mine[1]["seq"] and mine[1]["seq"] + 1 == mine[2]["seq"]
        p2p = [e for e in d["entries"] if e["p2p"]][-1]
        assert p2p["kind"] == ("send" if rank == 0 else "recv") and p2p["peer"] == 1 - rank, p2p


def test_a_job_that_went_right_is_reported_so(tmp_path):
    procs = _start("ok", tmp_path)
    for r, p in enumerate(procs):
        rc, _out, err = _wait(p)
        assert rc == 0, (r, err[-2000:])
    report, verdict = _analyse(tmp_path)
    assert verdict == {"culprits": {}, "ok": True}, report
    assert "every rank agrees, and nothing failed" in report
    assert "last completed collective: rank 0 #4, rank 1 #4, rank 2 #4" in report, report


def _run_small(env_extra, code):
    env = child_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                     **env_extra})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


RING = """
import json, sys, torch, torch.distributed as dist, ruccl_pg
dist.init_process_group("ruccl")
for i in range(12):
    dist.all_reduce(torch.ones(1))
d = json.load(open(ruccl_pg.dump_trace(sys.argv[1] if len(sys.argv) > 1 else None)))
print(json.dumps([e["seq"] for e in d["entries"]]))
"""


def test_the_ring_keeps_the_last_n_and_zero_turns_it_off(tmp_path):
    r = _run_small({"RUCCL_TRACE_BUFFER": "5", "RUCCL_TRACE_DIR": str(tmp_path)}, RING)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [7, 8, 9, 10, 11]
    r = _run_small({"RUCCL_TRACE_BUFFER": "0", "RUCCL_TRACE_DIR": str(tmp_path / "off")}, RING)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_a_bad_trace_buffer_is_a_clear_error():
    r = _run_small({"RUCCL_TRACE_BUFFER": "lots"}, RING)
    assert r.returncode != 0
    assert "RUCCL_ERR_INVALID_CONFIG: RUCCL_TRACE_BUFFER=lots" in r.stderr, r.stderr[-2000:]


def test_dump_trace_without_a_directory_is_a_clear_error():
    r = _run_small({"RUCCL_TRACE_DIR": ""}, RING)
    assert r.returncode != 0
    assert "RUCCL_ERR_INVALID_ARGUMENT: dump_trace: no directory" in r.stderr, r.stderr[-2000:]


ABORT = """
import json, os, sys, torch, torch.distributed as dist, ruccl_pg
from torch.distributed.distributed_c10d import _abort_process_group
dist.init_process_group("ruccl")
dist.all_reduce(torch.ones(3))
_abort_process_group()
d = json.load(open(os.path.join(os.environ["RUCCL_TRACE_DIR"], "ruccl_trace_rank_0.json")))
print(json.dumps([d["reason"], [(e["kind"], e["state"]) for e in d["entries"]]]))
"""


def test_an_abort_writes_the_trace(tmp_path):
    r = _run_small({"RUCCL_TRACE_DIR": str(tmp_path)}, ABORT)
    assert r.returncode == 0, r.stderr[-2000:]
    reason, entries = json.loads(r.stdout.strip().splitlines()[-1])
    assert reason == "abort"
    assert entries == [["all_reduce", "done"]], entries


CONCURRENT = """
import json, os, sys, threading, torch, torch.distributed as dist, ruccl_pg
dist.init_process_group("ruccl")
for i in range(300):
    dist.all_reduce(torch.ones(2))
threads = [threading.Thread(target=lambda: [ruccl_pg.dump_trace() for _ in range(20)]) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
d = json.load(open(os.path.join(os.environ["RUCCL_TRACE_DIR"], "ruccl_trace_rank_0.json")))
print(len(d["entries"]), sorted(os.listdir(os.environ["RUCCL_TRACE_DIR"])))
"""


def test_dumps_from_several_threads_at_once_leave_one_whole_file(tmp_path):
    r = _run_small({"RUCCL_TRACE_DIR": str(tmp_path)}, CONCURRENT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "300 ['ruccl_trace_rank_0.json']", r.stdout


# --------------------------------------------------------------------------------------
# the analyser alone, on made-up traces


def _entry(seq, kind="all_reduce", shape=(4,), state="done", group=0, p2p=False, error="", dtype="Float", op="SUM"):
    return {"id": 0, "group": group, "seq": seq, "p2p": p2p, "kind": kind, "dtype": dtype, "shape": list(shape),
            "tensors": 1, "op": op, "root": -1, "algorithm": "ring", "issued_ns": 1, "started_ns": 2,
            "finished_ns": 3, "state": state, "error": error}


def _dump(rank, groups, entries):
    return {"version": 1, "rank": rank, "pid": 1, "reason": "test", "dumped_ns": 10, "capacity": 2000,
            "groups": groups, "entries": entries}


def _verdict(dumps):
    from ruccl_pg.trace import analyse
    lines, culprits, ok = analyse(dumps)
    return "\n".join(lines), culprits, ok


def test_analyser_uneven_all_to_all_and_point_to_point_are_no_difference():
    w = [{"name": "0", "rank": r, "size": 2} for r in range(2)]
    dumps = {r: _dump(r, [w[r]], [_entry(0), _entry(1, "all_to_all_single", shape=(3 + r,), op=None),
                                  _entry(0, "send" if r == 0 else "recv", shape=(5,), p2p=True, op=None),
                                  _entry(2)]) for r in range(2)}
    report, culprits, ok = _verdict(dumps)
    assert ok and culprits == {}, report
    dumps[1]["entries"][1]["dtype"] = "Double"  # another dtype is a difference
    report, culprits, ok = _verdict(dumps)
    assert culprits == {"0": [0, 1]} and not ok, report  # two ranks: no majority, both named


def test_analyser_a_rank_whose_ring_lost_the_group_is_not_blamed():
    w = [{"name": "0", "rank": r, "size": 3} for r in range(3)]
    sub = {"name": "5", "rank": 0, "size": 1}
    dumps = {r: _dump(r, [w[r]], [_entry(s) for s in range(4)]) for r in range(2)}
    dumps[2] = _dump(2, [w[2], sub], [_entry(s, group=1) for s in range(7)])  # only the other group's calls left
    report, culprits, ok = _verdict(dumps)
    assert culprits == {} and ok, report


def test_analyser_keeps_a_group_made_again_apart():
    first = [{"name": "0", "rank": r, "size": 2} for r in range(2)]
    dumps = {}
    for r in range(2):
        groups = [first[r], dict(first[r])]  # destroy_process_group, then init again: the name "0" again
        entries = [_entry(s) for s in range(3)] + [_entry(0, group=1, shape=(4 + 2 * r,))]
        dumps[r] = _dump(r, groups, entries)
    dumps[1]["entries"][-1]["state"] = "error"
    dumps[1]["entries"][-1]["error"] = "RUCCL_ERR_SHAPE_MISMATCH: x"
    report, culprits, ok = _verdict(dumps)
    assert not ok and "0 (#2)" in culprits and "0" not in culprits, report
    assert 'group "0 (#2)"' in report and "collective #0" in report, report
