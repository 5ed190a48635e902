"""The finish race as a user meets it: WORLD ranks (default 8) each do K all-reduces
of 64 MB and then destroy_process_group() at once.  Prints OK, or FAILED: with what
each failing rank saw.  Oversubscribing the cores makes some rank lag behind in the
last all-reduce while the others already finish.

    python3 tests/python/finish_race.py            # RUCCL_PY_BACKEND=gloo for the reference
"""
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = int(os.environ.get("WORLD", "8"))
K = int(os.environ.get("K", "4"))
BACKEND = os.environ.get("RUCCL_PY_BACKEND", "").strip() or "ruccl"


def body(rank, f, q):
    if BACKEND == "ruccl":
        import ruccl_pg  # noqa: F401
    dist.init_process_group(BACKEND, init_method="file://" + f, rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    msg = "ok"
    try:
        x = torch.ones(16 << 20)
        for _ in range(K):
            dist.all_reduce(x)
        if x[0].item() != float(WORLD ** K) or x[-1].item() != float(WORLD ** K):
            msg = f"wrong result {x[0].item()} / {x[-1].item()}, want {float(WORLD ** K)}"
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the message is the result
        msg = str(e).splitlines()[0][:160]
    q.put((rank, msg))
    q.close()
    q.join_thread()
    os._exit(0)


def main():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    d = tempfile.mkdtemp()
    ps = [ctx.Process(target=body, args=(r, d + "/i", q)) for r in range(WORLD)]
    for p in ps:
        p.start()
    res = []
    try:
        for _ in ps:
            res.append(q.get(timeout=120))
    except Exception:  # noqa: BLE001
        res.append(("?", "no answer in 120 s"))
    for p in ps:
        p.kill()
    bad = [r for r in res if r[1] != "ok"]
    print("OK" if not bad else "FAILED: " + "; ".join(f"rank {r}: {m}" for r, m in bad[:3]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
