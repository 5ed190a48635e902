"""collective_training.py — data-parallel training on ruCCL, saved and resumed.

    python3 examples/collective_training.py train DIR    # a real model, checkpointed into DIR
    torchrun --nproc-per-node 4 --max-restarts 3 examples/collective_training.py train DIR
    python3 examples/collective_training.py run DIR      # update 1, save into DIR, update 2
    python3 examples/collective_training.py resume DIR   # restore DIR, update 2
    torchrun --nproc-per-node 2 examples/collective_training.py run DIR   # the same, under torchrun

`train` trains an MLP on scikit-learn's bundled digits (1,797 8x8 images, a fixed
stratified 80/20 split; nothing is downloaded) to at least 95% test accuracy: epochs
drawn by ruccl_pg.ResumableDistributedSampler (its own generator, its position saved),
--micro-batches micro-batches of gradient accumulation per step, all_reduce_gradients
before each optimizer step, a TrainingRecord every --save-every steps in DIR/checkpoints
(the newest --keep-last kept).  If DIR already holds a complete checkpoint, train
continues from the newest: that is what a `torchrun --max-restarts` restart does, and
the run ends with the same checksums, bit for bit, as one that was never interrupted.
Rank 0 shows a progress bar (step, loss, samples/s), then the test accuracy and the
wall time, and draws loss and accuracy against step into DIR/training.png.
Options: --steps N, --save-every K, --keep-last K, --micro-batches M, --batch B,
--backend ruccl|gloo, --timeout S (the process group's), --no-progress.

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
import time

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


def update(model, optimizer, scheduler, record):
    """The end of an update, after its last micro-batch's backward()."""
    import ruccl_pg

    ruccl_pg.all_reduce_gradients(model)  # the mean over the ranks, before the step
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    record.step += 1
    record.micro_batch = 0


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
        update(model, optimizer, scheduler, record)
        if args.command == "run" and not args.save_between_micro_batches and record.step == 1:
            save()
    return f"rank {rank} final checksum: {checksum(model)}"


# --------------------------------------------------------------------------------------
# train: a real model on real data, checkpointed, restartable


def load_digits_split():
    """scikit-learn's bundled digits (shipped inside the package), scaled to [0, 1], split
    80/20, stratified, with a fixed seed: the same tensors on every rank and every run."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.data, digits.target, test_size=0.2,
                                                        random_state=0, stratify=digits.target)
    as_x = lambda a: torch.tensor(a, dtype=torch.float32) / 16.0  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.int64)  # noqa: E731
    return as_x(x_train), as_y(y_train), as_x(x_test), as_y(y_test)


def make_digits_model():
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


@torch.no_grad()
def accuracy(model, x, y):
    was = model.training
    model.eval()
    acc = (model(x).argmax(dim=1) == y).float().mean().item()
    model.train(was)
    return acc


def plot(history, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history["step"], history["loss"], color="tab:blue", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over the ranks)", color="tab:blue")
    ax.set_yscale("log")
    ax2 = ax.twinx()
    ax2.plot(history["eval_step"], [100 * a for a in history["accuracy"]], color="tab:red", marker=".")
    ax2.set_ylabel("test accuracy (%)", color="tab:red")
    ax2.set_ylim(0, 100)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train_digits(rank, world, args):
    """The `train` command on one rank; returns its checksum line."""
    import ruccl_pg

    started = time.monotonic()
    torch.set_num_threads(1)  # one core a rank, and the same kernels on every run
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    x_train, y_train, x_test, y_test = (t.to(device) for t in load_digits_split())
    torch.manual_seed(0)  # the same initial weights on every rank
    model = make_digits_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    torch.manual_seed(1000 + rank)  # each rank's own dropout draws
    sampler = ruccl_pg.ResumableDistributedSampler(len(x_train), world, rank, seed=0)
    record = ruccl_pg.TrainingRecord(model, optimizer, scheduler, sampler=sampler)
    record.extra = {"history": {"step": [], "loss": [], "eval_step": [], "accuracy": []}}
    ckpt = os.path.join(args.dir, "checkpoints")
    # a restart continues from the newest complete checkpoint; every rank must see the same one
    latest = [None] * world
    dist.all_gather_object(latest, ruccl_pg.TrainingRecord.latest(ckpt))
    if len(set(latest)) != 1:
        raise RuntimeError(f"train: the ranks see different newest checkpoints in {ckpt}: {latest}")
    if latest[0] is not None:
        record.load(latest[0], map_location=device)
        if rank == 0:
            print(f"train: resumed from {latest[0]} (step {record.step}, epoch {sampler.epoch})",
                  file=sys.stderr, flush=True)
    history = record.extra["history"]

    def hook(_grad):
        ruccl_pg.fault_point("backward")  # a test hook: RUCCL_FAULT=backward:N kills in here

    for p in model.parameters():
        p.register_hook(hook)
    if rank == 0:  # the process group is formed and the state restored: training begins
        print(f"train: training from step {record.step} of {args.steps}", file=sys.stderr, flush=True)
    bar = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=record.step, desc="train", unit="step", file=sys.stderr,
                   mininterval=0.5, dynamic_ncols=True)
    samples_per_step = world * args.micro_batches * args.batch
    loss_sum = torch.zeros(1, device=device)
    tick, tick_step = time.monotonic(), record.step
    while record.step < args.steps:
        loss_sum.zero_()
        for micro in range(record.micro_batch, args.micro_batches):
            if sampler.remaining() < args.batch:  # the epoch's last partial batch is left out
                sampler.set_epoch(sampler.epoch + 1)
                record.epoch = sampler.epoch
            index = sampler.take(args.batch)
            loss = torch.nn.functional.cross_entropy(model(x_train[index]), y_train[index]) / args.micro_batches
            loss.backward()
            loss_sum += loss.detach()
            record.micro_batch = micro + 1
        update(model, optimizer, scheduler, record)
        dist.all_reduce(loss_sum)  # for the log only: the weights never see it
        history["step"].append(record.step)
        history["loss"].append(loss_sum.item() / world)
        if record.step % args.eval_every == 0 or record.step == args.steps:
            history["eval_step"].append(record.step)
            history["accuracy"].append(accuracy(model, x_test, y_test))
        if record.step % args.save_every == 0 or record.step == args.steps:
            record.save_rotating(ckpt, keep_last=args.keep_last)
        if bar is not None:
            now = time.monotonic()
            bar.update(1)
            if now - tick >= 0.5:
                rate = (record.step - tick_step) * samples_per_step / (now - tick)
                bar.set_postfix(loss=f"{history['loss'][-1]:.4f}", samples_s=f"{rate:,.0f}", refresh=False)
                tick, tick_step = now, record.step
    if bar is not None:
        bar.close()
    acc = accuracy(model, x_test, y_test)
    if rank == 0:
        png = os.path.join(args.dir, "training.png")
        plot(history, png, f"digits MLP, {world} ranks on {dist.get_backend()}, {args.steps} steps")
        print(f"train: test accuracy {100 * acc:.2f}% after {record.step} steps ({record.epoch + 1} epochs, "
              f"{samples_per_step} samples a step); wall time {time.monotonic() - started:.1f} s; "
              f"plot: {png}", file=sys.stderr, flush=True)
    # The job's end is collective too: no rank leaves before every rank has done its last
    # work (the final save, the evaluation, rank 0's plot), so a rank that dies or freezes
    # there is seen by the others (PEER_LOST), and torchrun restarts the job.
    dist.barrier()
    if rank == 0:
        print("train: finished", file=sys.stderr, flush=True)
    return f"rank {rank} final checksum: {checksum(model)}"


def run_command(rank, world, args):
    return train_digits(rank, world, args) if args.command == "train" else train(rank, world, args)


def init(args, **kw):
    import ruccl_pg  # noqa: F401  (registers the backend)

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout), **kw)


def worker(rank, world, args, init_method, results):
    """One rank started by this script (not under torchrun)."""
    try:
        init(args, init_method=init_method, rank=rank, world_size=world)
        line = run_command(rank, world, args)
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
    p.add_argument("command", choices=["train", "run", "resume"])
    p.add_argument("dir")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--world", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--backend", choices=["ruccl", "gloo"], default="ruccl")
    p.add_argument("--timeout", type=float, default=60.0, help="the process group's timeout, seconds")
    p.add_argument("--save-between-micro-batches", action="store_true",
                   help="run: save after the first micro-batch of update 1, pending gradients included")
    t = p.add_argument_group("train")
    t.add_argument("--steps", type=int, default=1000, help="optimizer steps (default 1000)")
    t.add_argument("--save-every", type=int, default=100, help="a checkpoint every K steps (default 100)")
    t.add_argument("--keep-last", type=int, default=3, help="checkpoints kept (default 3)")
    t.add_argument("--micro-batches", type=int, default=2, help="gradient accumulation per step (default 2)")
    t.add_argument("--batch", type=int, default=32, help="samples per micro-batch and rank (default 32)")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--eval-every", type=int, default=25, help="test accuracy every K steps (default 25)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.dir = os.path.abspath(args.dir)
    if args.world < 1:
        p.error("--world must be at least 1")
    for name in ("steps", "save_every", "keep_last", "micro_batches", "batch", "eval_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device (torch.cuda.is_available() is False)")
    return args


def main(argv=None):
    args = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        try:
            init(args)
            line = run_command(rank, world, args)
            sys.stdout.flush()
            os.write(1, (line + "\n").encode())  # one write: the ranks share torchrun's stdout
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            print(f"rank {rank}: error: {e}", file=sys.stderr, flush=True)
            if dist.is_initialized():  # as a user's `finally` would: it must not hang after PEER_LOST
                try:
                    dist.destroy_process_group()
                except Exception as e2:  # noqa: BLE001
                    print(f"rank {rank}: destroy_process_group: {e2}", file=sys.stderr, flush=True)
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
