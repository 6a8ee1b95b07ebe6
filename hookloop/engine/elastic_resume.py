"""Where a resumed run continues when the shape of an epoch changed (batch size, world size).

A checkpoint of a map-style run (hookloop's :class:`~hookloop.data.resumable.ResumableBatchSampler`,
one pass per epoch) stores its position in the epoch's global sample order,
``meta['samples_in_epoch']``, next to ``batch_size``, ``world_size``, ``iters_per_epoch`` and
the dataset size ``epoch_samples`` (a dataset of another size is not re-split mid-epoch: its
order is another one).
A resume with the same shape continues at the saved batch, exactly as an uninterrupted run.
With another shape:

* at an epoch boundary the epoch starts at its first batch and the iteration counter is
  re-based to ``epoch * iters_per_epoch`` of the new shape, so an iteration-based schedule
  is where a run with the new setting would be at that epoch;
* mid-epoch the samples of the epoch not yet trained, each once, are shared out over the
  new ranks and batched with the new batch size; they are the last ``R`` batches of the
  epoch in the new shape, so the resumed epoch starts at batch ``iters_per_epoch - R`` and
  the iteration counter at ``epoch * iters_per_epoch + iters_per_epoch - R``.

Loaders whose position cannot be re-split (a ``StatefulDataLoader``'s state, a custom
sampler read by fast-forward) keep the refusal of :func:`hookloop.checkpoint.resume_changes.check_epoch_length`,
with ``resume_policy='restart_epoch'`` as the way out.
"""
from typing import NamedTuple

from ..data.resumable import ResumableBatchSampler
from ..checkpoint.resume_changes import check_epoch_length


class ResumePoint(NamedTuple):
    epoch: int
    iter: int
    inner_iter: int
    start_sample: int  # > 0: the resumed epoch is re-split from this sample of its order
    note: str  # what changed and where the run continues ('' when nothing did)


def elastic_sampler(trainer):
    """The train loader's sampler when positions can be re-split (per-epoch passes), else None."""
    sampler = getattr(trainer.train_dataloader, 'batch_sampler', None)
    stream = getattr(trainer, 'train_stream', None)
    if isinstance(sampler, ResumableBatchSampler) and stream is not None and stream.per_epoch:
        return sampler
    return None


def position_meta(trainer, inner_iter):
    """The checkpoint ``meta`` entries that make a resume elastic (empty for other loaders)."""
    sampler = elastic_sampler(trainer) if trainer.train_dataloader is not None else None
    if sampler is None:
        return {}
    return {'batch_size': sampler.batch_size, 'epoch_samples': sampler.length,
            'samples_in_epoch': sampler.samples_before(inner_iter) if inner_iter else 0}


def plan(trainer, meta, path):
    """The :class:`ResumePoint` of a resume from a checkpoint with ``meta``; ConfigError for
    a mid-epoch change a loader cannot follow (without ``resume_policy='restart_epoch'``)."""
    epoch, it, inner = meta['epoch'], meta['iter'], meta['inner_iter']
    keep = ResumePoint(epoch, it, inner, 0, '')
    if trainer.train_dataloader is None:
        return keep
    saved_ipe, ipe, world = meta.get('iters_per_epoch'), trainer.iters_per_epoch, trainer.world_size
    sampler, per_epoch = elastic_sampler(trainer), trainer.train_stream.per_epoch
    if sampler is not None and saved_ipe is not None and saved_ipe == ipe and \
            meta.get('world_size', world) == world and meta.get('batch_size', sampler.batch_size) == sampler.batch_size:
        return keep
    samples = meta.get('samples_in_epoch')
    if sampler is not None and meta.get('epoch_samples', sampler.length) != sampler.length:
        samples = None  # another dataset: another order, so the saved position names other samples
    if sampler is None or saved_ipe is None or (inner and samples is None):
        if not per_epoch and not isinstance(getattr(trainer.train_dataloader, 'batch_sampler', None),
                                            ResumableBatchSampler):
            return keep  # a stream carries its own position (train_stream.py)
        restart = check_epoch_length(meta, ipe, world, trainer.resume_policy, path)  # refuses a mid-epoch change
        if restart is not None:
            return ResumePoint(*restart, 0, f"resume_policy='restart_epoch': {path} has {saved_ipe} batches per "
                                            f'epoch, this run {ipe}; continuing from the start of epoch '
                                            f'{restart[0] + 1} (iteration {restart[1]})')
        if per_epoch and inner == 0 and saved_ipe not in (None, ipe):
            return _at_boundary(meta, path, ipe, world)
        return keep
    if inner == 0:
        return _at_boundary(meta, path, ipe, world)
    new_inner = len(sampler) - sampler.remaining_batches(samples)
    new_iter = epoch * ipe + new_inner
    note = (f'{path} stopped after {samples} of the {sampler.length} samples of epoch {epoch + 1} '
            f'({_shape(meta)} then, {_shape_now(sampler, world, ipe)} now): the other '
            f'{sampler.length - samples} are shared out over {world} rank(s) in batches of {sampler.batch_size}, '
            f'as batches {new_inner}..{ipe - 1} of the epoch; iteration {it} is re-based to {new_iter}')
    return ResumePoint(epoch, new_iter, new_inner, samples, note)


def _at_boundary(meta, path, ipe, world):
    epoch = meta['epoch']
    note = (f'{path} ends epoch {epoch} ({_shape(meta)} then, {ipe} batches per epoch on {world} rank(s) '
            f'now): epoch {epoch + 1} starts at its first batch and iteration {meta["iter"]} is re-based to '
            f'{epoch * ipe}, where a run with the new setting starts it')
    return ResumePoint(epoch, epoch * ipe, 0, 0, note)


def _shape(meta):
    batch = f'batch {meta["batch_size"]}, ' if 'batch_size' in meta else ''
    return f'{batch}{meta.get("iters_per_epoch", "?")} batches per epoch on {meta.get("world_size", "?")} rank(s)'


def _shape_now(sampler, world, ipe):
    return f'batch {sampler.batch_size}, {ipe} batches per epoch on {world} rank(s)'


def apply(trainer, point):
    """After the trainer's position and data stream were loaded: move them to ``point``."""
    position = trainer.position
    position.epoch, position.iter, position.inner_iter = point.epoch, point.iter, point.inner_iter
    if point.start_sample:
        elastic_sampler(trainer).resume_split(point.epoch, point.start_sample, point.inner_iter)
