"""collective_training.py — data-parallel training on ruCCL, saved and resumed.

    python3 examples/collective_training.py run DIR      # update 1, save into DIR, update 2
    python3 examples/collective_training.py resume DIR   # restore DIR, update 2
    torchrun --nproc-per-node 2 examples/collective_training.py run DIR   # the same, under torchrun

Each rank trains the same small model (an MLP, AdamW, a StepLR schedule) on its own
data, drawn from its RNG: two micro-batches of gradient accumulation per update, then
ruccl_pg.all_reduce_gradients averages the gradients across the ranks before
optimizer.step().  ruccl_pg.TrainingRecord saves everything a resumed run needs, so
that `resume` ends bit for bit where `run` ends: both print one line per rank,

    rank R final checksum: HEX        (SHA-256 of the parameters' bytes in name order)

Options: --world N (ranks, default 2; started here unless under torchrun), --device
cpu|cuda (cuda: every rank on the default GPU), --save-between-micro-batches (save
in the middle of update 1's accumulation instead of after it: the pending gradients
are part of the record).  `run` refuses a DIR that exists; `resume` refuses one that
is missing or incomplete (or damaged, or from another world size or model).
"""
import argparse
import datetime
import hashlib
import os
import socket
import sys

import torch
import torch.distributed as dist

UPDATES = 2
MICRO_BATCHES = 2
BATCH = 8


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def checksum(model):
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        h.update(bytes(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def train(rank, world, args):
    import ruccl_pg

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    # every rank starts from the same weights, then draws its own data
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    torch.manual_seed(1000 + rank)
    record = ruccl_pg.TrainingRecord(model, optimizer, scheduler)

    exists = [None] * world
    dist.all_gather_object(exists, os.path.exists(args.dir))
    if args.command == "run" and any(exists):
        raise RuntimeError(f"run: {args.dir} already exists; run starts a new state directory "
                           "(use resume to continue from it, or choose another DIR)")
    if args.command == "resume":
        record.load(args.dir, map_location=device)

    def save():
        record.save(args.dir)

    while record.step < UPDATES:
        for micro in range(record.micro_batch, MICRO_BATCHES):
            x = torch.randn(BATCH, 16).to(device)
            y = torch.randn(BATCH, 4).to(device)
            loss = torch.nn.functional.mse_loss(model(x), y) / MICRO_BATCHES
            loss.backward()
            record.micro_batch = micro + 1
            if (args.command == "run" and args.save_between_micro_batches and record.step == 0
                    and record.micro_batch == 1):
                save()
        ruccl_pg.all_reduce_gradients(model)  # the mean over the ranks, before the step
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        record.step += 1
        record.micro_batch = 0
        if args.command == "run" and not args.save_between_micro_batches and record.step == 1:
            save()
    return f"rank {rank} final checksum: {checksum(model)}"


def worker(rank, world, args, init_method, results):
    """One rank started by this script (not under torchrun)."""
    try:
        import ruccl_pg  # noqa: F401  (registers the backend)
        dist.init_process_group("ruccl", init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        line = train(rank, world, args)
        dist.destroy_process_group()
        results.put((rank, True, line))
    except Exception as e:  # noqa: BLE001 - every rank reports its own error
        results.put((rank, False, f"rank {rank}: error: {e}"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["run", "resume"])
    p.add_argument("dir")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--world", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--save-between-micro-batches", action="store_true",
                   help="run: save after the first micro-batch of update 1, pending gradients included")
    args = p.parse_args(argv)
    args.dir = os.path.abspath(args.dir)
    if args.world < 1:
        p.error("--world must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device (torch.cuda.is_available() is False)")
    return args


def main(argv=None):
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        try:
            import ruccl_pg  # noqa: F401  (registers the backend)
            dist.init_process_group("ruccl", timeout=datetime.timedelta(seconds=60))
            line = train(rank, world, args)
            sys.stdout.flush()
            os.write(1, (line + "\n").encode())  # one write: the ranks share torchrun's stdout
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            print(f"rank {rank}: error: {e}", file=sys.stderr, flush=True)
            return 1
        return 0
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=worker, args=(r, args.world, args, init_method, results)) for r in range(args.world)]
    for proc in procs:
        proc.start()
    got = {}
    while len(got) < args.world:
        try:
            rank, ok, line = results.get(timeout=5)
            got[rank] = (ok, line)
        except Exception:  # noqa: BLE001 - queue.Empty: is anybody still alive?
            if all(not proc.is_alive() for proc in procs):
                break
    for proc in procs:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    failed = False
    for rank in range(args.world):
        ok, line = got.get(rank, (False, f"rank {rank}: error: the process ended without a result "
                                        f"(exit code {procs[rank].exitcode})"))
        print(line, file=sys.stdout if ok else sys.stderr, flush=True)
        failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
