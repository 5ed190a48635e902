"""Collective training on top of torch.distributed (any backend; ruccl by default).

all_reduce_gradients: the explicit gradient reduction between ``backward()`` and
``optimizer.step()``: parameters in name order, their ranks' agreement checked before
any data moves, gradients coalesced into flat buckets.

TrainingRecord: a collective save and restore of everything a resumed run needs
(model, optimizer, LR scheduler, pending accumulated gradients, counters, RNG states,
a user dict), one file per rank plus a manifest, committed atomically for the whole
directory.
"""
import concurrent.futures
import copy
import datetime
import hashlib
import json
import os
import random
import secrets
import shutil

import torch
import torch.distributed as dist

from .faults import fault_point

__all__ = ["all_reduce_gradients", "parameter_fingerprint", "TrainingRecord"]

MiB = 1 << 20


# --------------------------------------------------------------------------------------
# Parameters, fingerprints, agreement


def _named_params(model_or_named_params):
    """(name, parameter) pairs sorted by name, from a module, a mapping, or pairs."""
    src = model_or_named_params
    if isinstance(src, torch.nn.Module):
        items = list(src.named_parameters())
    elif hasattr(src, "items"):
        items = list(src.items())
    else:
        items = list(src)
    seen = set()
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError("expected an nn.Module, a mapping of names to tensors, or (name, tensor) pairs; "
                            f"got an item {type(item).__name__}")
        if item[0] in seen:
            raise ValueError(f"parameter name '{item[0]}' appears twice")
        seen.add(item[0])
    return sorted(items, key=lambda kv: kv[0])


def _entry(name, p, with_grad):
    """What the ranks must agree on for one parameter, as plain data."""
    e = [name, list(p.shape), str(p.dtype).replace("torch.", "")]
    if with_grad:
        g = p.grad
        e.append(None if g is None else str(g.dtype).replace("torch.", ""))
    return e


def _describe(e):
    if e is None:
        return "no such parameter"
    text = f"'{e[0]}' shape {tuple(e[1])} {e[2]}"
    if len(e) > 3:
        text += ", no gradient" if e[3] is None else f", gradient {e[3]}"
    return text


def _first_difference(lists, labels=None):
    """The first position (in name order) where the lists of entries differ, told the
    same way wherever it is computed from the same lists; None if they agree.  The
    lists are the ranks' (labels "rank R"), or whatever ``labels`` name."""
    n = max(len(entries) for entries in lists)
    for i in range(n):
        col = [entries[i] if i < len(entries) else None for entries in lists]
        if all(c == col[0] for c in col):
            continue
        name = min(c[0] for c in col if c is not None)
        groups = {}
        for k, c in enumerate(col):
            groups.setdefault(_describe(c), []).append(k)
        parts = []
        for desc, members in groups.items():
            if labels is not None:
                who = " and ".join(labels[k] for k in members)
            elif len(members) == 1:
                who = f"rank {members[0]}"
            else:
                who = "ranks " + _ranks_text(members)
            parts.append(f"{who}: {desc}")
        return f"parameter '{name}' (position {i} in name order) differs: " + "; ".join(parts)
    return None


def _ranks_text(ranks):
    if len(ranks) > 8:
        return ", ".join(map(str, ranks[:8])) + f" and {len(ranks) - 8} more"
    return ", ".join(map(str, ranks))


def _digest(entries):
    return hashlib.sha256(json.dumps(entries, separators=(",", ":")).encode()).digest()


def parameter_fingerprint(model_or_named_params):
    """SHA-256 (hex) of the parameters' names, shapes and dtypes in name order: what a
    TrainingRecord manifest records to recognise its model."""
    return _digest([_entry(n, p, False) for n, p in _named_params(model_or_named_params)]).hex()


def _agree(entries, digest, group, what):
    """Every rank of the group checks that all hold the same entries: one all-gather of
    their 32-byte digest, and only on a disagreement an exchange of the lists themselves
    so that every rank raises the same RuntimeError naming the first difference."""
    world = dist.get_world_size(group)
    if world == 1:
        return
    mine = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
    gathered = [torch.empty(32, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return
    lists = [None] * world
    dist.all_gather_object(lists, entries, group=group)
    diff = _first_difference(lists) or "the ranks' fingerprints differ"
    raise RuntimeError(f"{what}: the ranks' parameters disagree: {diff}")


# --------------------------------------------------------------------------------------
# all_reduce_gradients

_OPS = {"mean": "mean", "avg": "mean", "sum": "sum"}
_validated = {}  # validate="first": id(group) -> (group, the digest last validated on it)


def _op_kind(op):
    if isinstance(op, str) and op.lower() in _OPS:
        return _OPS[op.lower()]
    if op in (dist.ReduceOp.AVG,):
        return "mean"
    if op in (dist.ReduceOp.SUM,):
        return "sum"
    raise ValueError(f"op must be 'mean' or 'sum' (or ReduceOp.AVG / ReduceOp.SUM), got {op!r}")


def all_reduce_gradients(model_or_named_params, op="mean", group=None, bucket_bytes=25 * MiB,
                         validate="always"):
    """Reduces every parameter's ``.grad`` across the ranks of ``group`` (default: the
    default process group), in place: the mean (default) or the sum.

    Call it after ``backward()`` (after the last micro-batch of an update) and before
    ``optimizer.step()``.  Parameters go in name order.  Before any data moves the ranks
    agree on a fingerprint of (names, shapes, dtypes, which parameters have a gradient);
    a disagreement raises the same RuntimeError on every rank, naming the first
    differing parameter, and leaves the group usable.  ``validate="first"`` skips that
    exchange while this rank's fingerprint is the one last validated on this group (a
    rank whose parameters change then still fails, through the collectives' own shape
    checks, but possibly with a less specific error).

    Gradients that are None on every rank are skipped (frozen parameters).  The others
    below 256 KiB are coalesced into flat buffers of at most ``bucket_bytes`` per dtype
    and device (kept from call to call), reduced, and copied back into each ``.grad``;
    larger ones are reduced in place, each on its own.  Every reduction is issued
    asynchronously, in the same order on every rank, before the first is waited for."""
    kind = _op_kind(op)
    if validate not in ("always", "first"):
        raise ValueError(f"validate must be 'always' or 'first', got {validate!r}")
    if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
    named = _named_params(model_or_named_params)
    for name, p in named:
        g = p.grad
        if g is not None and (g.is_sparse or g.layout != torch.strided):
            raise ValueError(f"parameter '{name}': sparse gradients are not supported")
    pg = group if group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    entries = [_entry(n, p, True) for n, p in named]
    digest = _digest(entries)
    if validate == "always" or _validated.get(id(pg), (None, None)) != (pg, digest):
        _agree(entries, digest, group, "all_reduce_gradients")
        if validate == "first":
            _validated[id(pg)] = (pg, digest)  # the group itself: its id is not reused meanwhile
            while len(_validated) > 16:
                del _validated[next(iter(_validated))]
    grads = [p.grad for _, p in named if p.grad is not None]
    if world == 1 or not grads:
        return
    native_avg = kind == "mean" and dist.get_backend(group) == "ruccl"
    reduce_op = dist.ReduceOp.AVG if native_avg else dist.ReduceOp.SUM
    flats = _flat_buffers(pg)
    pending = []
    for index, bucket in enumerate(_buckets(grads, bucket_bytes)):
        alone = len(bucket) == 1 and bucket[0].is_contiguous()
        if alone:
            flat = bucket[0]
        else:
            numel = sum(g.numel() for g in bucket)
            key = (index, bucket[0].dtype, bucket[0].device, numel)
            flat = flats.get(key)
            if flat is None:
                flat = flats[key] = torch.empty(numel, dtype=bucket[0].dtype, device=bucket[0].device)
            torch.cat([g.reshape(-1) for g in bucket], out=flat)
        work = dist.all_reduce(flat, op=reduce_op, group=group, async_op=True)
        pending.append((work, flat, bucket, alone))
    fault_point("collective")
    for work, flat, bucket, alone in pending:
        work.wait()
        if kind == "mean" and not native_avg:
            flat.div_(world)
        if alone:
            continue
        offset = 0
        for g in bucket:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n


# Flat bucket buffers, kept from call to call per group (as DDP keeps its buckets): a
# fresh 25 MB buffer per call costs more in page faults than its all-reduce.
_flats = {}  # id(group) -> (group, {(bucket index, dtype, device, numel): tensor})


def _flat_buffers(pg):
    entry = _flats.get(id(pg))
    if entry is None or entry[0] is not pg:
        entry = _flats[id(pg)] = (pg, {})
        while len(_flats) > 4:
            del _flats[next(iter(_flats))]
    if len(entry[1]) > 256:  # the layout keeps changing: start over
        entry[1].clear()
    return entry[1]


ALONE_BYTES = 256 * 1024


def _buckets(grads, bucket_bytes):
    """Buckets in name order.  A gradient of ALONE_BYTES or more (or more than
    bucket_bytes) is a bucket of its own, reduced in place: copying it in and out of a
    flat buffer would cost more than its own collective.  The smaller ones are
    coalesced per (dtype, device); a bucket is closed when the next gradient would take
    it past bucket_bytes."""
    open_buckets, sizes, done = {}, {}, []
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if nbytes >= min(ALONE_BYTES, bucket_bytes):
            done.append([g])
            continue
        key = (g.dtype, g.device)
        if key in open_buckets and sizes[key] + nbytes > bucket_bytes:
            done.append(open_buckets.pop(key))
        if key not in open_buckets:
            open_buckets[key], sizes[key] = [], 0
        open_buckets[key].append(g)
        sizes[key] += nbytes
    done.extend(open_buckets.values())
    return done


# --------------------------------------------------------------------------------------
# TrainingRecord

FORMAT = "ruccl-training-record/1"
MANIFEST = "manifest.json"
_FLAG_KEYS = ("foreach", "fused", "capturable", "differentiable", "maximize")
_PLAIN = (type(None), bool, int, float, str, torch.Tensor, torch.dtype, torch.device, torch.Size)


class _HashingWriter:
    """A binary file that hashes what goes through it (torch.save writes here)."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, b):
        self.sha.update(b)
        n = self.f.write(b)
        self.size += n
        return n

    def flush(self):
        self.f.flush()


def _committed(root):
    """The names of save_rotating's committed checkpoints in root (those with their
    manifest), oldest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith("step-") and os.path.isfile(os.path.join(root, n, MANIFEST)))


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_plain(value, where):
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"{where}: key {k!r} is not a str or int")
            _check_plain(v, f"{where}[{k!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__name__}: a TrainingRecord holds plain data only "
                    "(None, bool, int, float, str, tensors, and lists/tuples/dicts of them)")


def _rng_state():
    state = {"torch": torch.get_rng_state(), "python": _python_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    return state


def _python_rng_state():
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _set_rng_state(state):
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            return
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.cpu().numpy().astype("uint32"), pos, has_gauss, cached))


class TrainingRecord:
    """A collective checkpoint of one training run, one file per rank.

        record = ruccl_pg.TrainingRecord(model, optimizer, scheduler)
        record.step += 1                          # counters: step, epoch, micro_batch
        record.save("ckpt/step-1")               # every rank of the group calls it
        ...
        record.load("ckpt/step-1")               # restores everything in place

    What a save holds, per rank: the model's state_dict, the optimizer's (its
    foreach/fused flags too), the LR scheduler's, every parameter's pending ``.grad``
    (a save between micro-batches resumes mid-accumulation), the counters, the RNG
    states (torch CPU, CUDA when initialised, Python ``random``, NumPy when installed),
    the data sampler's position (``sampler=``: anything with ``state_dict()`` and
    ``load_state_dict()``, such as ruccl_pg.ResumableDistributedSampler) and ``extra``
    (a user dict of plain data).  Beside the rank files, a manifest
    (manifest.json) gives the world size, each rank's file with its size and SHA-256,
    the parameters' fingerprint, the torch and ruccl versions and the creation time.

    A save is atomic for the whole directory: every rank writes and fsyncs its file in a
    temporary directory beside the target; once all have, rank 0 writes the manifest
    last and renames the directory into place.  A process killed at any point leaves
    the previous checkpoint as it was and the new one complete or absent.  A load checks
    the manifest, the world size, the checksum and the fingerprint on every rank and
    changes nothing unless all pass; every rank then raises the same error.

    The directory must be on a file system that every rank of the group sees."""

    def __init__(self, model, optimizer=None, scheduler=None, *, sampler=None, group=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if sampler is not None and not (callable(getattr(sampler, "state_dict", None))
                                        and callable(getattr(sampler, "load_state_dict", None))):
            raise TypeError(f"sampler must have state_dict() and load_state_dict() (as "
                            f"ruccl_pg.ResumableDistributedSampler has), got {type(sampler).__name__}")
        self.model, self.optimizer, self.scheduler, self.group = model, optimizer, scheduler, group
        self.sampler = sampler
        self.step = 0
        self.epoch = 0
        self.micro_batch = 0
        self.extra = {}

    # ---- collective helpers (every rank raises the same error) ----

    def _world(self):
        return dist.get_world_size(self.group), dist.get_rank(self.group)

    def _gather(self, value, error, what, failed=None):
        """Every rank's value, once no rank has an error (None when fine); else every rank
        runs ``failed`` (if any) and raises the first error."""
        world, _ = self._world()
        both = [None] * world
        dist.all_gather_object(both, (value, error), group=self.group)
        bad = [(r, e) for r, (_, e) in enumerate(both) if e is not None]
        if bad:
            if failed is not None:
                failed()
            r, e = bad[0]
            more = f" (and {len(bad) - 1} other rank(s))" if len(bad) > 1 else ""
            raise RuntimeError(f"{what}: rank {r}: {e}{more}")
        return [v for v, _ in both]

    def _from_rank0(self, value, error, what):
        """Rank 0's (value, error) on every rank; raises its error everywhere."""
        box = [(value, error)]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        value, error = box[0]
        if error is not None:
            raise RuntimeError(f"{what}: rank 0: {error}")
        return value

    # ---- what a rank saves ----

    def _entries(self):
        return [_entry(n, p, False) for n, p in _named_params(self.model)]

    def _counters(self):
        return {"step": int(self.step), "epoch": int(self.epoch), "micro_batch": int(self.micro_batch)}

    def _state(self):
        _check_plain(self.extra, "extra")
        state = {
            "format": FORMAT,
            "model": self.model.state_dict(),
            "grads": {n: (None if p.grad is None else p.grad.detach()) for n, p in _named_params(self.model)},
            "counters": self._counters(),
            "rng": _rng_state(),
            "extra": self.extra,
        }
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
            state["optimizer_class"] = type(self.optimizer).__name__
            state["optimizer_flags"] = [{k: g.get(k) for k in _FLAG_KEYS} for g in self.optimizer.param_groups]
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
            state["scheduler_class"] = type(self.scheduler).__name__
        if self.sampler is not None:
            state["sampler"] = self.sampler.state_dict()
            state["sampler_class"] = type(self.sampler).__name__
        return state

    # ---- save ----

    def save(self, path):
        """Saves into the directory ``path``, which must not exist yet.  Collective:
        every rank of the group calls it with the same path.  Returns the path."""
        return self._save(os.path.abspath(os.fspath(path)), keep_last=None)

    def save_rotating(self, root, keep_last=3):
        """Saves into ``root/step-NNNNNNNNNN`` (this record's ``step``) and then, once that
        checkpoint is committed, deletes all but the newest ``keep_last`` in ``root``.
        Returns the new checkpoint's path; ``TrainingRecord.latest(root)`` finds it."""
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last must be an int >= 1, got {keep_last!r}")
        root = os.path.abspath(os.fspath(root))
        return self._save(os.path.join(root, f"step-{int(self.step):010d}"), keep_last=keep_last)

    @staticmethod
    def latest(root):
        """The newest committed checkpoint directory under ``root`` (save_rotating's
        layout), or None.  Half-written saves are never returned."""
        names = _committed(root)
        return os.path.join(root, names[-1]) if names else None

    def _save(self, path, keep_last):
        world, rank = self._world()
        what = f"TrainingRecord.save({path})"
        parent, name = os.path.dirname(path), os.path.basename(path)
        # 1. rank 0 makes the temporary directory beside the target (and sweeps the
        #    leftovers of saves that were killed)
        tmp, error = None, None
        if rank == 0:
            try:
                if os.path.lexists(path):
                    raise FileExistsError(f"{path} already exists")
                os.makedirs(parent, exist_ok=True)
                for leftover in os.listdir(parent):
                    if leftover.startswith(".") and ".tmp-" in leftover and leftover.endswith(".ruccl"):
                        shutil.rmtree(os.path.join(parent, leftover), ignore_errors=True)
                tmp = os.path.join(parent, f".{name}.tmp-{secrets.token_hex(6)}.ruccl")
                os.mkdir(tmp)
            except OSError as e:
                error = str(e)
        tmp = self._from_rank0(tmp, error, what)
        # 2. every rank writes and fsyncs its own file
        info, error = None, None
        try:
            if not os.path.isdir(tmp):
                raise FileNotFoundError(f"{tmp} is not visible from this rank: the checkpoint directory must be "
                                        "on a file system that every rank sees")
            state = self._state()
            fname = f"rank-{rank:05d}.pt"
            with open(os.path.join(tmp, fname), "wb") as f:
                w = _HashingWriter(f)
                torch.save(state, w)
                f.flush()
                os.fsync(f.fileno())
            info = {"rank": rank, "file": fname, "bytes": w.size, "sha256": w.sha.hexdigest()}
        except Exception as e:  # noqa: BLE001 - reported on every rank
            error = f"{type(e).__name__}: {e}"
        infos = self._gather(info, error, f"{what}, nothing was saved",
                             failed=(lambda: shutil.rmtree(tmp, ignore_errors=True)) if rank == 0 else None)
        fault_point("save-files")
        # 3. rank 0 writes the manifest last and commits the directory
        error = None
        if rank == 0:
            try:
                entries = self._entries()
                manifest = {
                    "format": FORMAT,
                    "world_size": world,
                    "files": infos,
                    "fingerprint": _digest(entries).hex(),
                    "parameters": entries,
                    "counters": self._counters(),
                    "torch_version": torch.__version__,
                    "ruccl_version": _ruccl_version(),
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                }
                with open(os.path.join(tmp, MANIFEST + ".tmp"), "w") as f:
                    json.dump(manifest, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(os.path.join(tmp, MANIFEST + ".tmp"), os.path.join(tmp, MANIFEST))
                _fsync_dir(tmp)
                os.rename(tmp, path)  # the commit
                _fsync_dir(parent)
                if keep_last is not None:
                    for old in _committed(parent)[:-keep_last]:
                        shutil.rmtree(os.path.join(parent, old), ignore_errors=True)
            except OSError as e:
                error = str(e)
                shutil.rmtree(tmp, ignore_errors=True)
        self._from_rank0(None, error, what)
        return path

    # ---- load ----

    def load(self, path, map_location="cpu"):
        """Restores the state saved in ``path`` into this record's model, optimizer,
        scheduler, gradients, counters, RNG states and ``extra``.  Collective.  Tensors
        load onto ``map_location`` (as torch.load takes it) and then into the model's
        own parameters (their device).  Every rank checks the manifest, the world size,
        its file's size and SHA-256 and the model's fingerprint first; if any rank finds
        a problem, every rank raises the same RuntimeError and nothing is changed.
        Returns this record's counters as a dict."""
        path = os.path.abspath(os.fspath(path))
        world, rank = self._world()
        what = f"TrainingRecord.load({path})"
        state, error = None, None
        try:
            state = self._read(path, world, rank, map_location)
        except Exception as e:  # noqa: BLE001 - reported on every rank
            error = f"{e}"
        fault_point("load")
        self._gather(None, error, what)
        self._apply(state)  # _read checked every part against this record: nothing here fails half-way
        return self._counters()

    def _read(self, path, world, rank, map_location):
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no checkpoint directory at {path}")
        mpath = os.path.join(path, MANIFEST)
        if not os.path.isfile(mpath):
            raise FileNotFoundError("no manifest.json: not a complete TrainingRecord checkpoint")
        try:
            with open(mpath) as f:
                manifest = json.load(f)
        except (ValueError, OSError) as e:
            raise ValueError(f"manifest.json is corrupted ({e})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"manifest.json is not a {FORMAT} manifest")
        if manifest.get("world_size") != world:
            raise ValueError(f"saved by {manifest.get('world_size')} ranks, but this group has {world}")
        entry = next((e for e in manifest.get("files", []) if isinstance(e, dict) and e.get("rank") == rank), None)
        if entry is None:
            raise ValueError(f"the manifest lists no file for rank {rank}")
        mine = self._entries()
        if manifest.get("fingerprint") != _digest(mine).hex():
            diff = _first_difference([manifest.get("parameters") or [], mine], ["saved", "this model"])
            raise ValueError(f"saved from another model: {diff or 'the fingerprints differ'}")
        fpath = os.path.join(path, entry["file"])
        # the checksum is computed beside the load (hashlib lets go of the GIL), and the
        # state is used only once it matches
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            verified = pool.submit(_verify_file, fpath, entry)
            try:
                state = torch.load(fpath, map_location=map_location, weights_only=True)
            except Exception as e:  # noqa: BLE001 - a damaged file: the checksum says how
                verified.result()
                raise ValueError(f"{entry['file']} cannot be loaded: {e}") from None
            verified.result()
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{entry['file']} is not a {FORMAT} rank file")
        for part, obj in (("optimizer", self.optimizer), ("scheduler", self.scheduler), ("sampler", self.sampler)):
            if (obj is None) != (part not in state):
                raise ValueError(f"the checkpoint {'has' if part in state else 'has no'} {part} state, but this "
                                 f"record {'has no' if obj is None else 'has a'} {part}")
            if obj is not None and state[f"{part}_class"] != type(obj).__name__:
                raise ValueError(f"saved with a {state[f'{part}_class']} {part}, this record has a "
                                 f"{type(obj).__name__}")
        if self.sampler is not None:  # its own checks (length, world), on a copy: nothing changes yet
            copy.deepcopy(self.sampler).load_state_dict(state["sampler"])
        model_state = self.model.state_dict()
        saved_model = state.get("model", {})
        for k, v in model_state.items():
            w = saved_model.get(k)
            if not isinstance(w, torch.Tensor) or w.shape != v.shape:
                raise ValueError(f"the saved model state has no tensor '{k}' of shape {tuple(v.shape)}")
        extra_keys = sorted(set(saved_model) - set(model_state))
        if extra_keys:
            raise ValueError(f"the saved model state has entries this model does not: {extra_keys[:5]}")
        if self.optimizer is not None:
            saved_groups = state["optimizer"].get("param_groups", [])
            if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in self.optimizer.param_groups]:
                raise ValueError("the optimizer's parameter groups differ from the saved ones")
        return state

    def _apply(self, state):
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            flags = state.get("optimizer_flags")
            if flags is not None:
                for g, saved in zip(self.optimizer.param_groups, flags):
                    for k, v in saved.items():
                        if k in g or v is not None:
                            g[k] = v
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
        for n, p in _named_params(self.model):
            g = state["grads"].get(n)
            p.grad = None if g is None else g.to(device=p.device)
        counters = state["counters"]
        self.step, self.epoch, self.micro_batch = counters["step"], counters["epoch"], counters["micro_batch"]
        self.extra = state["extra"]
        _set_rng_state(state["rng"])


def _verify_file(path, entry):
    """Raises unless the file's size and SHA-256 match the manifest's entry."""
    name, want = entry["file"], entry.get("bytes")
    try:
        f = open(path, "rb", buffering=0)
    except OSError as e:
        raise FileNotFoundError(f"{name} is missing or unreadable ({e.strerror})") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != want:
            raise ValueError(f"{name} is truncated or padded: {size} bytes, the manifest says {want}")
        buf = bytearray(4 << 20)
        view, sha, done = memoryview(buf), hashlib.sha256(), 0
        while done < size:
            n = f.readinto(view)
            if not n:
                raise ValueError(f"{name} is truncated: it ended after {done} bytes")
            sha.update(view[:n])
            done += n
    if sha.hexdigest() != entry.get("sha256"):
        raise ValueError(f"{name} is corrupted: its SHA-256 does not match the manifest")


def _ruccl_version():
    try:
        from . import _C
        return _C.version()
    except Exception:  # noqa: BLE001
        return "unknown"
