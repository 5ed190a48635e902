"""A distributed sampler that resumes where it stopped.

torch.utils.data.DistributedSampler draws each epoch's order from a generator seeded
with ``seed + epoch`` (good: not from the global RNG), but it has no position: a run
restored in the middle of an epoch either repeats the epoch's first batches or skips
the rest of it.  This one counts the indices it has handed out, and a TrainingRecord
given it (``TrainingRecord(..., sampler=s)``) saves and restores that count with the
epoch, so the resumed run draws exactly the samples the uninterrupted one would have.
"""
import math

import torch
import torch.distributed as dist

__all__ = ["ResumableDistributedSampler"]


class ResumableDistributedSampler(torch.utils.data.Sampler):
    """Indices of one rank's share of a dataset of ``len(dataset)`` (or an int) items.

    Each epoch the whole index range is shuffled by a ``torch.Generator`` of its own,
    seeded with ``seed + epoch`` (the global RNG is never drawn from), padded by wrapping
    around (or cut, with ``drop_last``) to a multiple of the world size, and rank R takes
    every world-th index from R on, as torch's DistributedSampler does.

    ``position`` counts the indices of this epoch already handed out; iterating starts
    there, and ``set_epoch`` (the next epoch) sets it back to 0.  Iterating draws lazily,
    one index at a time, so ``position`` is what the consumer took (with a DataLoader,
    exact for ``num_workers=0``; workers prefetch).  ``state_dict()`` /
    ``load_state_dict()`` hold (seed, epoch, position, world, shuffle, drop_last, length);
    a load refuses a state of another dataset length or world size."""

    def __init__(self, dataset, num_replicas=None, rank=None, *, shuffle=True, seed=0, drop_last=False):
        n = dataset if isinstance(dataset, int) else len(dataset)
        if n < 0:
            raise ValueError(f"the dataset's length must be >= 0, got {n}")
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.length, self.num_replicas, self.rank = n, num_replicas, rank
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch, self.position = 0, 0
        if drop_last:
            self.num_samples = n // num_replicas
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __len__(self):
        """This rank's indices per epoch (all of them, wherever ``position`` stands)."""
        return self.num_samples

    def remaining(self):
        """The indices of this epoch not yet handed out."""
        return self.num_samples - self.position

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` from its first index."""
        self.epoch, self.position = int(epoch), 0

    def _order(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=g)
        else:
            order = torch.arange(self.length)
        if self.total_size > self.length and self.length > 0:  # pad by wrapping around
            reps = math.ceil(self.total_size / self.length)
            order = order.repeat(reps)
        order = order[:self.total_size]
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        mine = self._order().tolist()
        while self.position < self.num_samples:
            index = mine[self.position]
            self.position += 1
            yield index

    def take(self, count):
        """The next ``count`` indices of this epoch as a list (fewer at its end)."""
        mine = self._order()[self.position:self.position + count].tolist()
        self.position += len(mine)
        return mine

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "length": self.length,
                "num_replicas": self.num_replicas, "shuffle": self.shuffle, "drop_last": self.drop_last}

    def load_state_dict(self, state):
        for key in ("length", "num_replicas", "shuffle", "drop_last"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"the sampler's saved {key} is {state.get(key)!r}, this sampler's is "
                                 f"{getattr(self, key)!r}")
        position = int(state["position"])
        if not 0 <= position <= self.num_samples:
            raise ValueError(f"the sampler's saved position {position} is outside [0, {self.num_samples}]")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), position
