"""Resumable, rank-sharded batches whose order and worker randomness depend only on
``(seed, epoch, position)``.

* The epoch's order is ``torch.randperm(n)`` from a generator seeded with
  ``seed + epoch`` — the same order ``DistributedSampler`` uses — or, for a loader that
  shuffles with a generator of the user's, the order torch's ``RandomSampler`` draws from it
  (:mod:`hookloop.data.generator_order`); then padded (or cut) to a multiple of the world
  size and shared out: rank r takes positions r, r+W, ...
* Resuming at batch k of an epoch starts the sampler at k: skipped batches are never
  loaded or collated. Where a run is in its epoch is one record, the number of samples of the
  epoch's order trained (:meth:`ResumableBatchSampler.samples_before`, a checkpoint's
  ``meta['samples_in_epoch']``); a resume in any shape continues from it
  (:meth:`ResumableBatchSampler.start_at`, ``hookloop/engine/elastic_resume.py``): the samples not
  yet seen are shared out over the new ranks, each once, however many resumes came before.
* Each batch carries a seed derived from ``(seed, epoch, rank, batch index)``; a data-loader
  worker reseeds ``random``, NumPy and torch with it before loading the batch, so
  augmentations do not depend on which worker loads a batch or on how long workers
  have lived. (In the main process, ``num_workers=0``, the global RNG is left alone:
  its state is part of every checkpoint.)
"""
import math
import random

import numpy as np
import torch
from torch.utils.data import (BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler,
                              SequentialSampler)
from torch.utils.data.distributed import DistributedSampler

from ..errors import ConfigError
from .generator_order import generator_order

_MASK64 = (1 << 64) - 1


def mix_seed(*values):
    """A well-spread 63-bit seed from integers (splitmix64 over the sequence)."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state + (int(value) & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1


def epoch_order(length, seed, epoch, shuffle):
    """The sample order of an epoch, as ``DistributedSampler`` computes it."""
    if not shuffle:
        return list(range(length))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(length, generator=generator).tolist()


def shard(order, rank, world_size, drop_last=False):
    """Rank ``rank``'s positions of ``order``: padded by wrapping around (or cut when
    ``drop_last``) to a multiple of ``world_size``, then every ``world_size``-th item."""
    if world_size == 1:
        return order
    if drop_last:
        total = (len(order) // world_size) * world_size
        order = order[:total]
    else:
        total = math.ceil(len(order) / world_size) * world_size
        padding = total - len(order)
        order = order + (order * math.ceil(padding / max(len(order), 1)))[:padding]
    return order[rank:total:world_size]


class ResumableBatchSampler(torch.utils.data.Sampler):
    """Batches of sample indices for an epoch, from any batch on: a pure function of
    ``(seed, epoch, rank)``. With ``seed_batches`` each batch is a :class:`SeededBatch`,
    which tells a :class:`SeededDataset` in a worker how to seed it.
    Call :meth:`set_epoch` before each epoch (the trainer does).

    ``global_rng_draws`` (default 0: the global RNG is not touched) makes each epoch that
    starts at batch 0 draw that many int64 numbers from the global torch RNG before its
    first batch, as torch's DataLoader does (its base seed, and a shuffling RandomSampler's
    seed: 2); an epoch re-entered at a later batch on resume draws none, as the RNG state
    restored from the checkpoint already follows those draws. ``dreambooth_diffusion`` sets
    it to match diffusers' scripts without pinning the RNG.
    """

    global_rng_draws = 0

    def __init__(self, length, batch_size, shuffle=False, seed=0, drop_last=False,
                 rank=0, world_size=1, shard_drop_last=False, seed_batches=True, order=None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f'batch_size must be a positive int, got {batch_size!r}')
        self.length = length
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.shard_drop_last = shard_drop_last
        self.seed_batches = seed_batches
        # Shuffled orders from the user's generator (a GeneratorOrder), else from (seed, epoch).
        self.order = order if shuffle else None
        self.epoch = 0
        self.start_batch = 0
        # The pass being read: batches ``first_batch``, ... of pass ``epoch`` hold its order from
        # position ``first_sample`` on. (e, 0, 0) is the whole epoch; an epoch continued in another
        # shape (batch size, world size) starts later in both (:meth:`start_at`).
        self._pass = (0, 0, 0)

    def set_epoch(self, epoch, start_batch=0):
        """Read pass ``epoch`` from batch ``start_batch`` on. A later batch of the pass being read
        continues it (``train()`` again after a stop, also in an epoch :meth:`start_at` began)."""
        pass_epoch, _, first_batch = self._pass
        if epoch != pass_epoch or start_batch < first_batch:
            self._pass = (epoch, 0, 0)
        self.epoch = epoch
        self.start_batch = start_batch

    def start_at(self, epoch, samples):
        """Continue pass ``epoch`` after the first ``samples`` of its order (over all ranks), which
        were trained, possibly with another batch size or world size: the rest is shared out over
        this sampler's ranks and batched. Returns the batch of the pass to start from (then
        ``set_epoch(epoch, batch)``); where the rest lines up with this shape's batches, the pass
        is the uninterrupted one, read from there."""
        self._pass, batch = self._pass_after(epoch, samples)
        return batch

    def batch_after(self, samples):
        """The batch :meth:`start_at` would start from, without moving the sampler."""
        return self._pass_after(self.epoch, samples)[1]

    def _pass_after(self, epoch, samples):
        step = self.batch_size * self.world_size
        if samples >= self.length:
            return (epoch, 0, 0), len(self)
        if samples % step == 0:
            return (epoch, 0, 0), samples // step
        first = len(self) - self.remaining_batches(samples)
        return (epoch, samples, first), first

    def _first_sample(self):
        """Where in the epoch's order the pass being read starts its ``first_batch``."""
        pass_epoch, first_sample, _ = self._pass
        return first_sample if pass_epoch == self.epoch else 0

    def _rest_per_rank(self, start_sample):
        rest = max(self.length - start_sample, 0)
        if self.world_size == 1:
            return rest
        return rest // self.world_size if self.shard_drop_last else math.ceil(rest / self.world_size)

    def remaining_batches(self, start_sample):
        """Batches of this rank for the samples of an epoch's order from ``start_sample`` on."""
        n = self._rest_per_rank(start_sample)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def samples_before(self, batch):
        """Position in the current epoch's order (samples, over all ranks) once ``batch``
        batches of the pass are done: the record a checkpoint keeps and a resume continues from."""
        if batch >= len(self):
            return self.length
        first_sample, first_batch = self._first_sample(), self._pass[2]
        if not first_sample:
            first_batch = 0
        return min(first_sample + max(batch - first_batch, 0) * self.batch_size * self.world_size, self.length)

    def indices(self):
        """This rank's sample indices for the current pass (from its first batch), in order."""
        if self.order is not None:
            order = self.order.order(self.epoch, self.length)
        else:
            order = epoch_order(self.length, self.seed, self.epoch, self.shuffle)
        start = self._first_sample()
        if start:
            return shard(order[start:], self.rank, self.world_size, self.shard_drop_last)
        return shard(order, self.rank, self.world_size, self.shard_drop_last)

    def num_samples(self):
        if self.world_size == 1:
            return self.length
        if self.shard_drop_last:
            return self.length // self.world_size
        return math.ceil(self.length / self.world_size)

    def __len__(self):
        n = self.num_samples()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        indices, size = self.indices(), self.batch_size
        skipped = self._pass[2] if self._first_sample() else 0  # a later-starting pass's list begins at its first batch
        if self.start_batch == 0:
            for _ in range(self.global_rng_draws):
                torch.empty((), dtype=torch.int64).random_()
        for batch_index in range(self.start_batch, len(self)):
            batch = indices[(batch_index - skipped) * size:(batch_index - skipped + 1) * size]
            if self.seed_batches:  # only workers seed (the main process fetches a plain list)
                batch = SeededBatch(batch)
                batch.seed_key = (self.seed, self.epoch, self.rank, batch_index)
            yield batch


class SeededBatch(list):
    """A batch's sample indices, plus ``seed_key`` = (seed, epoch, rank, batch index),
    from which a worker derives the batch's seed (only workers pay for it)."""

    seed_key = None


def seed_everything(seed):
    """Seed Python's, NumPy's and torch's global generators (torch's seeds every CUDA device
    too). Call it before building the model and data, so their initial randomness repeats;
    it does not make CUDA kernels deterministic (see ``torch.use_deterministic_algorithms``)."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


class SeededDataset(Dataset):
    """Wraps a map-style dataset. The loader fetches whole :class:`SeededBatch` es through
    ``__getitems__``; in a worker the RNGs are reseeded from the batch's ``seed_key``
    first. Single items (``loader.dataset[i]``) read the wrapped dataset as is."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __getitems__(self, batch):
        seed_key = getattr(batch, 'seed_key', None)
        if seed_key is not None and torch.utils.data.get_worker_info() is not None:
            seed_everything(mix_seed(*seed_key))
        fetch_many = getattr(self.dataset, '__getitems__', None)
        if fetch_many is not None:
            return fetch_many(list(batch))
        dataset = self.dataset
        return [dataset[i] for i in batch]

    def __getattr__(self, name):  # user code may ask the loader's dataset for its own attributes
        if name == 'dataset':
            raise AttributeError(name)
        return getattr(self.dataset, name)


def resumable_loader(dataset, batch_size=1, shuffle=False, seed=0, drop_last=False, rank=0,
                     world_size=1, **loader_kwargs):
    """A DataLoader over ``dataset`` with a :class:`ResumableBatchSampler`."""
    workers = loader_kwargs.get('num_workers', 0) > 0
    sampler = ResumableBatchSampler(len(dataset), batch_size, shuffle=shuffle, seed=seed,
                                    drop_last=drop_last, rank=rank, world_size=world_size, seed_batches=workers)
    return DataLoader(SeededDataset(dataset) if workers else dataset, batch_sampler=sampler, **loader_kwargs)


_KEPT_LOADER_ARGS = ('num_workers', 'collate_fn', 'pin_memory', 'timeout', 'worker_init_fn',
                     'multiprocessing_context', 'prefetch_factor', 'persistent_workers',
                     'pin_memory_device', 'in_order')


def make_resumable(loader, seed, rank=0, world_size=1, loader_name='train_dataloader'):
    """Rebuild a user's DataLoader around a :class:`ResumableBatchSampler`.

    Returns the loader unchanged when it is already resumable or cannot be rebuilt
    (an IterableDataset, a loader with its own ``state_dict``, or a custom sampler); the
    trainer then resumes it through its state or by fast-forward (``hookloop.data.stream_state``).
    """
    if isinstance(getattr(loader, 'batch_sampler', None), ResumableBatchSampler):
        return loader
    if isinstance(loader.dataset, IterableDataset) or callable(getattr(loader, 'state_dict', None)):
        return loader  # a stream, or a loader that keeps its own position (StatefulDataLoader)
    batch_sampler = loader.batch_sampler
    if batch_sampler is None or type(batch_sampler) is not BatchSampler:
        return loader
    sampler = batch_sampler.sampler
    if isinstance(sampler, (RandomSampler, SequentialSampler)) and not hasattr(type(loader.dataset), '__len__'):
        raise ConfigError(f'{loader_name}: {type(loader.dataset).__name__} is a map-style dataset without __len__, '
                          f'which its {type(sampler).__name__} needs; give it a __len__, make it an '
                          'IterableDataset, or pass a sampler of your own')
    order = None
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler._num_samples is not None:
            return loader
        shuffle, shard_drop_last = True, False
        order = generator_order(loader, sampler)  # the user's seeded order, when the loader has one
    elif isinstance(sampler, SequentialSampler):
        shuffle, shard_drop_last = False, False
    elif isinstance(sampler, DistributedSampler):
        shuffle, shard_drop_last = sampler.shuffle, sampler.drop_last
        seed = sampler.seed if seed is None else seed
    else:
        return loader
    kwargs = {name: getattr(loader, name) for name in _KEPT_LOADER_ARGS if hasattr(loader, name)}
    if kwargs.get('num_workers', 0) == 0:
        kwargs.pop('prefetch_factor', None)
        kwargs.pop('persistent_workers', None)
    workers = kwargs.get('num_workers', 0) > 0  # only workers need the batches' seeds
    new_sampler = ResumableBatchSampler(len(loader.dataset), batch_sampler.batch_size, shuffle=shuffle,
                                        seed=seed, drop_last=batch_sampler.drop_last, rank=rank,
                                        world_size=world_size, shard_drop_last=shard_drop_last,
                                        seed_batches=workers, order=order)
    dataset = SeededDataset(loader.dataset) if workers else loader.dataset
    return DataLoader(dataset, batch_sampler=new_sampler, **kwargs)


def set_loader_epoch(loader, seed, epoch, rank=0, start_batch=0):
    """Prepare ``loader`` for pass ``epoch``, starting at batch ``start_batch``.

    A :class:`ResumableBatchSampler` is moved there directly (and the loader's generator,
    which seeds the workers, is reseeded from ``(seed, epoch, rank)`` so it never draws from
    the global RNG). Otherwise ``set_epoch(epoch)`` is called on the sampler
    (``DistributedSampler``) and on the dataset (an HF ``datasets.IterableDataset`` reshuffles
    its shards and buffer with it) where they have one; ``start_batch`` is then the caller's
    business (fast-forward or a loaded ``state_dict``).
    """
    sampler = getattr(loader, 'batch_sampler', None)
    if isinstance(sampler, ResumableBatchSampler):
        sampler.seed = seed
        sampler.set_epoch(epoch, start_batch)
        if loader.generator is None:
            loader.generator = torch.Generator()
        loader.generator.manual_seed(mix_seed(seed, epoch, rank, 1))
        return
    for owner in (getattr(loader, 'sampler', None), getattr(loader, 'dataset', None)):
        if callable(getattr(owner, 'set_epoch', None)):
            owner.set_epoch(epoch)
