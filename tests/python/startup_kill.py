"""A torchrun worker for test_fault_training.py: in the first attempt, rank WORLD-1 is
killed after every other rank has entered init_process_group (and so taken its
rendezvous ticket) but before it enters it itself.  torchrun keeps its store across
restarts, so the restarted attempt's ranks must still meet in one session."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import ruccl_pg  # noqa: F401  (registers the backend)

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=60))
if attempt == 0 and rank == world - 1:
    store.wait([f"startup-kill/{r}" for r in range(world - 1)])
    time.sleep(1.5)  # they are in init_process_group: their tickets are taken
    os.kill(os.getpid(), 9)
store.set(f"startup-kill/{rank}", "in init")
dist.init_process_group(sys.argv[1], timeout=datetime.timedelta(seconds=30))
x = torch.ones(4)
dist.all_reduce(x)
os.write(1, f"attempt {attempt} rank {rank}: all_reduce gives {x[0].item():.0f}\n".encode())  # one write: a shared stdout
dist.destroy_process_group()
