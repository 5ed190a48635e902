"""Collective training: ruccl_pg.all_reduce_gradients and ruccl_pg.TrainingRecord, in
real processes, and the example trainer (examples/collective_training.py) run and
resumed as a user runs it."""
import hashlib
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from dist_harness import HERE, IS_GLOO, child_env

ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(ROOT, "examples", "collective_training.py")

pytestmark = pytest.mark.skipif(IS_GLOO, reason="RUCCL_PY_BACKEND=gloo: these test ruccl_pg's own training API")


# --------------------------------------------------------------------------------------
# The example trainer, as a user runs it


def example(*args, timeout=180):
    p = subprocess.run([sys.executable, EXAMPLE, *map(str, args)], env=child_env(), capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout.splitlines(), p.stderr.splitlines()


def checksum_lines(out, world):
    assert len(out) == world, f"want exactly one line per rank, got {out}"
    for r, line in enumerate(out):
        assert line.startswith(f"rank {r} final checksum: ") and len(line.split()[-1]) == 64, line
    return out


def tree_digest(path):
    """Every file's name and bytes under path: proof that nothing was written."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(path)):
        dirnames.sort()
        for name in sorted(filenames):
            h.update(os.path.relpath(os.path.join(dirpath, name), path).encode())
            with open(os.path.join(dirpath, name), "rb") as f:
                h.update(f.read())
    return h.hexdigest(), sorted(os.listdir(os.path.dirname(path)))


@pytest.mark.parametrize("world", [2, 3])
def test_run_then_resume_is_bit_identical(tmp_path, world):
    rc, out, err = example("run", tmp_path / "a", "--world", world)
    assert rc == 0, err
    ran = checksum_lines(out, world)
    assert len(set(line.split()[-1] for line in ran)) == 1, f"the ranks' models differ: {ran}"
    rc, out, err = example("resume", tmp_path / "a", "--world", world)
    assert rc == 0, err
    assert checksum_lines(out, world) == ran
    # a save between the two micro-batches of update 1 (pending accumulated gradients)
    rc, out, err = example("run", tmp_path / "b", "--world", world, "--save-between-micro-batches")
    assert rc == 0, err
    assert checksum_lines(out, world) == ran, "saving must not change the run"
    rc, out, err = example("resume", tmp_path / "b", "--world", world)
    assert rc == 0, err
    assert checksum_lines(out, world) == ran


@pytest.fixture(scope="module")
def saved_state(tmp_path_factory):
    d = tmp_path_factory.mktemp("state") / "ckpt"
    rc, out, err = example("run", d)
    assert rc == 0, err
    return d


def error_lines(err, world):
    lines = [line for line in err if line.startswith("rank ") and ": error: " in line]
    assert sorted(int(line.split()[1].rstrip(":")) for line in lines) == list(range(world)), err
    return lines


def test_run_refuses_an_existing_dir(tmp_path):
    d = tmp_path / "exists"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    before = tree_digest(d)
    rc, out, err = example("run", d)
    assert rc != 0 and out == []
    for line in error_lines(err, 2):
        assert "already exists" in line, line
    assert tree_digest(d) == before


def _flip_byte(d):
    p = d / "rank-00001.pt"
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def _truncate(d):
    p = d / "rank-00000.pt"
    p.write_bytes(p.read_bytes()[:1000])


@pytest.mark.parametrize("damage,args,expect", [
    ("missing", (), "no checkpoint directory"),
    ("no manifest", (), "no manifest.json: not a complete TrainingRecord checkpoint"),
    ("truncated", (), "rank-00000.pt is truncated"),
    ("corrupted", (), "rank-00001.pt is corrupted: its SHA-256 does not match"),
    ("rank file gone", (), "rank-00001.pt is missing"),
    ("wrong world size", ("--world", "3"), "saved by 2 ranks, but this group has 3"),
])
def test_resume_refuses_a_bad_state_on_every_rank(tmp_path, saved_state, damage, args, expect):
    d = tmp_path / "ckpt"
    if damage != "missing":
        shutil.copytree(saved_state, d)
    {"no manifest": lambda: (d / "manifest.json").unlink(),
     "truncated": lambda: _truncate(d),
     "corrupted": lambda: _flip_byte(d),
     "rank file gone": lambda: (d / "rank-00001.pt").unlink()}.get(damage, lambda: None)()
    before = tree_digest(d) if d.exists() else None
    rc, out, err = example("resume", d, *args)
    assert rc != 0 and out == [], (out, err)
    lines = error_lines(err, int(args[1]) if args else 2)
    for line in lines:
        assert expect in line, f"{damage}: {line}"
    assert len(set(line.split(": error: ")[1] for line in lines)) == 1, f"not the same error everywhere: {lines}"
    assert (tree_digest(d) if d.exists() else None) == before, "a refused resume wrote something"


# --------------------------------------------------------------------------------------
# A rank killed in the middle of a save


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def _setup(rank):
    import ruccl_pg

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    torch.manual_seed(100 + rank)
    return model, opt, sched, ruccl_pg.TrainingRecord(model, opt, sched)


def _update(model, opt, sched, record):
    import ruccl_pg

    for _ in range(2):
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        (torch.nn.functional.mse_loss(model(x), y) / 2).backward()
    ruccl_pg.all_reduce_gradients(model)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    record.step += 1


def _digest_params(model):
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(bytes(p.detach().reshape(-1).view(torch.uint8).tolist()))
    return h.hexdigest()


def _train_without_stopping(rank, world_size, updates):
    model, opt, sched, record = _setup(rank)
    for _ in range(updates):
        _update(model, opt, sched, record)
    return _digest_params(model)


def _train_and_die_in_a_save(rank, world_size, root, victim, stage):
    """Update, save (committed), update, save: `victim` is killed at `stage` of the
    second save; the survivors must get an error, not hang."""
    import ruccl_pg.training as training

    model, opt, sched, record = _setup(rank)
    _update(model, opt, sched, record)
    record.save_rotating(root, keep_last=1)
    _update(model, opt, sched, record)
    if rank == victim:
        die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
        if stage == "writing its file":
            real_save = training.torch.save

            def half_save(obj, f):
                real_save(obj, f)
                f.f.truncate(f.size // 2)
                die()
            training.torch.save = half_save
        elif stage == "before the commit":
            real_rename = training.os.rename

            def rename(src, dst):
                if os.path.basename(dst).startswith("step-"):
                    die()
                real_rename(src, dst)
            training.os.rename = rename
        elif stage == "after the commit":
            training.shutil.rmtree = lambda *a, **k: die()
    try:
        record.save_rotating(root, keep_last=1)
    except RuntimeError as e:
        return f"error: {e}"
    return "saved"


def _resume_latest(rank, world_size, root, updates):
    import ruccl_pg

    model, opt, sched, record = _setup(rank)
    path = ruccl_pg.TrainingRecord.latest(root)
    record.load(path)
    while record.step < updates:
        _update(model, opt, sched, record)
    return os.path.basename(path), _digest_params(model)


def _spawn_until_death(fn, world, args):
    """Runs fn on `world` fresh ranks (own process group over ruccl); returns each rank's
    result, or None for a rank that died."""
    import queue

    ctx = torch.multiprocessing.get_context("spawn")
    q = ctx.Queue()
    port = __import__("dist_harness").free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, fn, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    for p in procs:
        p.join(120)
    while True:
        try:
            r, value = q.get(timeout=1)
            got[r] = value
        except queue.Empty:
            break
    for p in procs:
        if p.is_alive():
            p.kill()
    return [got.get(r) for r in range(world)]


def _rank_main(rank, world, port, fn, args, q):
    import datetime

    import ruccl_pg  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("ruccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        value = fn(rank, world, *args)
    except Exception as e:  # noqa: BLE001
        value = f"raised {type(e).__name__}: {e}"
    q.put((rank, value))
    q.close()
    q.join_thread()
    os._exit(0)


@pytest.mark.parametrize("victim,stage,expect", [
    (1, "writing its file", "step-0000000001"),
    (0, "before the commit", "step-0000000001"),
    (0, "after the commit", "step-0000000002"),
])
def test_a_rank_killed_in_a_save_leaves_a_loadable_checkpoint(pools, tmp_path, victim, stage, expect):
    reference = pools.run(2, _train_without_stopping, 3)
    root = str(tmp_path / "ckpts")
    results = _spawn_until_death(_train_and_die_in_a_save, 2, (root, victim, stage))
    assert results[victim] is None, f"the victim was to die: {results}"
    survivor = results[1 - victim]
    assert survivor is not None and survivor.startswith("error:") and "RUCCL_ERR_PEER_LOST" in survivor, results
    names = sorted(os.listdir(root))
    assert expect in names, names
    resumed = pools.run(2, _resume_latest, root, 3)
    assert [name for name, _ in resumed] == [expect, expect]
    assert [digest for _, digest in resumed] == reference, "the resumed run is not the run that never stopped"


# --------------------------------------------------------------------------------------
# TrainingRecord's API


def _record_roundtrip(rank, world_size, root):
    import random

    import numpy as np
    import ruccl_pg

    model, opt, sched, record = _setup(rank)
    _update(model, opt, sched, record)
    x = torch.randn(4, 8)
    torch.nn.functional.mse_loss(model(x), torch.zeros(4, 2)).backward()  # pending gradients
    record.epoch, record.micro_batch, record.extra = 3, 1, {"note": f"rank {rank}", "t": torch.arange(3)}
    random.seed(rank)
    np.random.seed(rank)
    paths = [record.save_rotating(root, keep_last=2)]
    for _ in range(2):
        record.step += 1
        paths.append(record.save_rotating(root, keep_last=2))
    kept = sorted(os.listdir(root))
    want = (torch.randn(3), random.random(), float(np.random.rand()))
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    # wreck everything, then load the middle checkpoint
    model2, opt2, sched2, record2 = _setup(rank + 50)
    torch.randn(100)
    random.random()
    counters = record2.load(paths[1])
    got = (torch.randn(3), random.random(), float(np.random.rand()))
    problems = []
    if kept != [os.path.basename(p) for p in paths[1:]]:
        problems.append(f"keep_last=2 kept {kept}")
    if ruccl_pg.TrainingRecord.latest(root) != paths[-1]:
        problems.append(f"latest is {ruccl_pg.TrainingRecord.latest(root)}")
    if counters != {"step": 2, "epoch": 3, "micro_batch": 1}:
        problems.append(f"counters {counters}")
    if record2.extra["note"] != f"rank {rank}" or not torch.equal(record2.extra["t"], torch.arange(3)):
        problems.append(f"extra {record2.extra}")
    if not (torch.equal(got[0], want[0]) and got[1:] == want[1:]):
        problems.append("RNG states (torch, random, numpy) not restored")
    for n, p in model2.named_parameters():
        if not torch.equal(p, params[n]) or not torch.equal(p.grad, grads[n]):
            problems.append(f"{n}: parameter or pending gradient not restored")
    if any(not torch.equal(opt2.state[p]["momentum_buffer"], m) for p, m in zip(model2.parameters(), momentum)):
        problems.append("optimizer state not restored")
    if sched2.last_epoch != sched.last_epoch or opt2.param_groups[0]["lr"] != opt.param_groups[0]["lr"]:
        problems.append("scheduler state not restored")
    return problems


def test_record_restores_everything_and_keeps_the_last_k(pools, tmp_path):
    assert pools.run(2, _record_roundtrip, str(tmp_path / "r")) == [[], []]


def _optimizer_flags_and_map_location(rank, world_size, root):
    import ruccl_pg

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    record = ruccl_pg.TrainingRecord(model, opt)
    record.save(os.path.join(root, "x"))
    opt2 = torch.optim.AdamW(model.parameters(), foreach=True)
    seen = []
    record2 = ruccl_pg.TrainingRecord(model, opt2)
    real_load = torch.load

    def spy(*a, **k):
        seen.append(k.get("map_location"))
        return real_load(*a, **k)
    torch.load = spy
    try:
        record2.load(os.path.join(root, "x"), map_location="cpu")
    finally:
        torch.load = real_load
    return opt2.param_groups[0]["foreach"], seen


def test_optimizer_flags_come_back_and_map_location_is_honoured(pools, tmp_path):
    assert pools.run(2, _optimizer_flags_and_map_location, str(tmp_path)) == [(False, ["cpu"])] * 2


def _load_of_another_model(rank, world_size, root):
    import ruccl_pg

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    ruccl_pg.TrainingRecord(model).save(os.path.join(root, "m"))
    other = torch.nn.Linear(4, 5)
    before = [p.detach().clone() for p in other.parameters()]
    try:
        ruccl_pg.TrainingRecord(other).load(os.path.join(root, "m"))
    except RuntimeError as e:
        msg = str(e)
    else:
        msg = "loaded"
    unchanged = all(torch.equal(a, b) for a, b in zip(before, other.parameters()))
    # and the group still works
    t = torch.ones(2)
    dist.all_reduce(t)
    return msg, unchanged, t.tolist()


def test_load_of_another_model_is_refused_everywhere_and_changes_nothing(pools, tmp_path):
    res = pools.run(2, _load_of_another_model, str(tmp_path))
    assert res[0] == res[1], res
    msg, unchanged, t = res[0]
    assert "saved from another model" in msg and "'bias'" in msg and "saved" in msg and "this model" in msg, msg
    assert unchanged and t == [2.0, 2.0]


def _save_into_existing(rank, world_size, root):
    import ruccl_pg

    os.makedirs(os.path.join(root, "taken"), exist_ok=True)
    dist.barrier()
    try:
        ruccl_pg.TrainingRecord(torch.nn.Linear(2, 2)).save(os.path.join(root, "taken"))
    except RuntimeError as e:
        return str(e)
    return "saved"


def test_save_into_an_existing_dir_is_refused_everywhere(pools, tmp_path):
    res = pools.run(2, _save_into_existing, str(tmp_path))
    assert res[0] == res[1] and "already exists" in res[0], res
    assert os.listdir(tmp_path / "taken") == []
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == [], "a temporary directory was left"


# --------------------------------------------------------------------------------------
# all_reduce_gradients


def _mismatch(rank, world_size, kind):
    import ruccl_pg

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    if rank == world_size - 1:
        if kind == "shape":
            model[1] = torch.nn.Linear(3, 5)
        elif kind == "extra parameter":
            model.append(torch.nn.Linear(2, 2))
        elif kind == "dtype":
            model[1].to(torch.float64)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    if kind == "gradient on one rank only" and rank == 0:
        model[0].bias.grad = None
    try:
        ruccl_pg.all_reduce_gradients(model)
        msg = "no error"
    except RuntimeError as e:
        msg = str(e)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    return msg, t.tolist()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind,names", [
    ("shape", "'1.bias'"),
    ("extra parameter", "'2.bias'"),
    ("dtype", "'1.bias'"),
    ("gradient on one rank only", "'0.bias'"),
])
def test_disagreeing_ranks_get_the_same_error_and_the_group_goes_on(pools, world, kind, names):
    res = pools.run(world, _mismatch, kind)
    msgs = [m for m, _ in res]
    assert len(set(msgs)) == 1, msgs
    assert "the ranks' parameters disagree" in msgs[0] and names in msgs[0], msgs[0]
    total = float(sum(range(world)))
    assert all(t == [total] * 3 for _, t in res)


def _bucketed_vs_per_tensor(rank, world_size, integers):
    import ruccl_pg

    g = torch.Generator().manual_seed(7 + rank)
    shapes = [(3,), (17, 5), (1,), (64, 64), (2, 3, 4), (1000,)] * 5

    def fresh():
        params = {}
        for i, s in enumerate(shapes):
            p = torch.nn.Parameter(torch.zeros(s))
            grad = torch.randint(-50, 50, s, generator=g).float() if integers else torch.randn(s, generator=g)
            p.grad = grad
            params[f"p{i:02d}"] = p
        return params

    base = fresh()
    runs = {}
    for label, bucket in (("one bucket", 1 << 30), ("small buckets", 4096), ("default", 25 << 20)):
        params = {n: torch.nn.Parameter(p.detach().clone()) for n, p in base.items()}
        for n, p in params.items():
            p.grad = base[n].grad.clone()
        ruccl_pg.all_reduce_gradients(params, bucket_bytes=bucket)
        runs[label] = {n: p.grad for n, p in params.items()}
    per_tensor = {}
    for n in sorted(base):
        t = base[n].grad.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        per_tensor[n] = t
    out = []
    for label, grads in runs.items():
        for n in base:
            if integers and not torch.equal(grads[n], per_tensor[n]):
                out.append(f"{label}: {n} differs from the per-tensor all-reduce")
            if not integers and not torch.allclose(grads[n], per_tensor[n], rtol=1e-6, atol=1e-7):
                out.append(f"{label}: {n} differs from the per-tensor all-reduce beyond rounding")
    return out


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("integers", [True, False])
def test_bucketed_reduction_equals_per_tensor_reduction(pools, world, integers):
    assert pools.run(world, _bucketed_vs_per_tensor, integers) == [[]] * world


def _against_one_process(rank, world_size):
    import ruccl_pg

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))
    g = torch.Generator().manual_seed(42)
    x, y = torch.randn(8 * world_size, 6, generator=g), torch.randn(8 * world_size, 3, generator=g)
    whole = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))
    whole.load_state_dict(model.state_dict())
    torch.nn.functional.mse_loss(whole(x), y).backward()
    shard = slice(8 * rank, 8 * (rank + 1))
    torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
    ruccl_pg.all_reduce_gradients(model)
    return [float((a.grad - b.grad).abs().max()) for a, b in zip(model.parameters(), whole.parameters())]


@pytest.mark.parametrize("world", [2, 3])
def test_averaged_gradients_equal_one_process_on_the_whole_batch(pools, world):
    for diffs in pools.run(world, _against_one_process):
        assert max(diffs) < 1e-6, diffs


def _edge_cases(rank, world_size):
    import ruccl_pg

    out = {}
    # an empty model, and one whose gradients are all None (frozen)
    ruccl_pg.all_reduce_gradients(torch.nn.Module())
    frozen = torch.nn.Linear(3, 3).requires_grad_(False)
    ruccl_pg.all_reduce_gradients(frozen)
    out["frozen"] = all(p.grad is None for p in frozen.parameters())
    # mixed dtypes: fp32 and bf16 go in separate buckets; SUM
    a = torch.nn.Parameter(torch.zeros(5))
    b = torch.nn.Parameter(torch.zeros(7, dtype=torch.bfloat16))
    a.grad = torch.full((5,), float(rank + 1))
    b.grad = torch.full((7,), float(rank + 1), dtype=torch.bfloat16)
    ruccl_pg.all_reduce_gradients({"a": a, "b": b}, op="sum")
    want = float(sum(range(1, world_size + 1)))
    out["mixed"] = (a.grad.tolist() == [want] * 5, b.grad.dtype == torch.bfloat16, b.grad.tolist() == [want] * 7)
    # a non-contiguous gradient gets its result back in place
    c = torch.nn.Parameter(torch.zeros(4, 3))
    c.grad = torch.full((3, 4), float(rank)).t()
    ruccl_pg.all_reduce_gradients([("c", c)])
    out["noncontiguous"] = c.grad.tolist() == [[sum(range(world_size)) / world_size] * 3] * 4
    # validate="first": one agreement exchange, then none while nothing changes
    calls = []
    real = dist.all_gather

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    dist.all_gather = counting
    try:
        for _ in range(3):
            ruccl_pg.all_reduce_gradients({"a": a}, validate="first")
        first = len(calls)
        for _ in range(2):
            ruccl_pg.all_reduce_gradients({"a": a})
    finally:
        dist.all_gather = real
    out["validate"] = (first, len(calls) - first)
    try:
        ruccl_pg.all_reduce_gradients({"a": a}, op="max")
    except ValueError as e:
        out["bad op"] = "op must be" in str(e)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_frozen_empty_mixed_dtypes_noncontiguous_and_validate_first(pools, world):
    for out in pools.run(world, _edge_cases):
        assert out == {"frozen": True, "mixed": (True, True, True), "noncontiguous": True,
                       "validate": (1, 2), "bad op": True}, out


def test_the_example_runs_unchanged_under_torchrun(tmp_path):
    """torchrun --nproc-per-node 2 run, then resume: the same lines as the self-started run."""
    rc, out, err = example("run", tmp_path / "self")
    assert rc == 0, err
    ran = checksum_lines(out, 2)
    lines = []
    for command in ("run", "resume"):
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            EXAMPLE, command, str(tmp_path / "tr")], env=child_env(), capture_output=True, text=True,
                           timeout=180)
        assert p.returncode == 0, p.stderr[-4000:]
        got = sorted(line for line in p.stdout.splitlines() if " final checksum: " in line)
        assert got == ran, f"torchrun {command}: {p.stdout}"
        lines.append(got)
    assert lines[0] == lines[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch sees a CUDA device: the refusal does not apply")
def test_device_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    rc, out, err = example("run", tmp_path / "c", "--device", "cuda")
    assert rc == 2 and out == [] and not (tmp_path / "c").exists()
    assert any("--device cuda: this torch sees no CUDA device" in line for line in err), err
