"""A 3-rank job that goes wrong on purpose, for test_flight_recorder.py.

    RANK=r WORLD_SIZE=3 MASTER_ADDR=... MASTER_PORT=... RUCCL_TRACE_DIR=DIR python trace_job.py SCENARIO

Every rank does three all-reduces and a broadcast, then the fifth collective goes wrong:
  skip   rank 1 skips the all-reduce (it calls the next collective, a broadcast);
  shape  rank 2 all-reduces 5 elements where the others all-reduce 4;
  kill   rank 2 is killed (SIGKILL) instead;
  freeze rank 2 sleeps instead (hung in Python: its process lives, its heartbeat too),
         until the test sends it SIGUSR1 for its trace and kills it.
  ok     nothing goes wrong; every rank writes its trace (ruccl_pg.dump_trace()) at the end.
A rank whose collective fails prints the error and exits 3.
"""
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ruccl_pg

scenario = sys.argv[1]
rank = int(os.environ["RANK"])
torch.set_num_threads(1)
dist.init_process_group("ruccl", timeout=timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "60"))))
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
dist.broadcast(t, src=0)
try:
    if scenario == "skip" and rank == 1:
        dist.broadcast(t, src=0)
    elif scenario == "shape" and rank == 2:
        dist.all_reduce(torch.ones(5))
    elif scenario == "kill" and rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    elif scenario == "freeze" and rank == 2:
        print("frozen", flush=True)
        time.sleep(300)
    else:
        dist.all_reduce(t)
except RuntimeError as e:
    print(f"rank {rank}: {e}", file=sys.stderr, flush=True)
    os._exit(3)
if scenario == "ok":
    ruccl_pg.dump_trace()
dist.destroy_process_group()
