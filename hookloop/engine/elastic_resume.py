"""Where a resumed run continues in its epoch, whatever shape (batch size, world size) the
epoch was trained in before.

A checkpoint of a map-style run (hookloop's :class:`~hookloop.data.resumable.ResumableBatchSampler`,
one pass per epoch) records where the run is in its epoch as one number, the samples of the
epoch's global order trained, ``meta['samples_in_epoch']``, next to the ``batch_size`` and
``world_size`` they were trained with, ``iters_per_epoch`` and the dataset size
``epoch_samples`` (a dataset of another size is not re-split mid-epoch: its order is another
one). The sampler keeps the same record while it runs (``samples_before``), so a resume, a
``train()`` again after a stop and the sampler all read one thing, and a resume plan is a
function of that record and the new loader only, after any number of resumes and re-splits:

* the samples of the epoch not yet trained, each once, are shared out over the new ranks and
  batched with the new batch size (where they line up with the new shape's batches, the
  uninterrupted pass is read from there); they are the last ``R`` batches of the epoch in the
  new shape, so the resumed epoch starts at batch ``iters_per_epoch - R``;
* the iteration counter is kept when that is the saved batch of an epoch of the saved length,
  and re-based to ``epoch * iters_per_epoch + iters_per_epoch - R`` otherwise (at an epoch
  boundary: ``epoch * iters_per_epoch``), so an iteration-based schedule is where a run with
  the new setting would be.

Loaders whose position cannot be re-split (a ``StatefulDataLoader``'s state, a custom
sampler read by fast-forward) keep the refusal of :func:`hookloop.checkpoint.resume_changes.check_epoch_length`,
with ``resume_policy='restart_epoch'`` as the way out. Every position field is range-checked
first (:func:`hookloop.checkpoint.resume_position.check_position`).
"""
from typing import NamedTuple

from ..data.resumable import ResumableBatchSampler
from ..checkpoint.resume_changes import check_epoch_length
from ..checkpoint.resume_position import check_position


class ResumePoint(NamedTuple):
    epoch: int
    iter: int
    inner_iter: int
    start_sample: int  # samples of the epoch's order trained (the record the sampler continues from); None: not used
    note: str  # what changed and where the run continues ('' when nothing did)


def elastic_sampler(trainer):
    """The train loader's sampler when positions can be re-split (per-epoch passes), else None."""
    sampler = getattr(trainer.train_dataloader, 'batch_sampler', None)
    stream = getattr(trainer, 'train_stream', None)
    if isinstance(sampler, ResumableBatchSampler) and stream is not None and stream.per_epoch:
        return sampler
    return None


def position_meta(trainer, inner_iter):
    """The checkpoint ``meta`` entries of the epoch's record and the run's length (the record is
    empty for loaders whose position cannot be re-split)."""
    length = {'max_iters': trainer.max_iters, 'max_epochs': trainer.max_epochs} \
        if trainer.train_dataloader is not None else {}
    sampler = elastic_sampler(trainer) if trainer.train_dataloader is not None else None
    if sampler is None:
        return length
    order = {'data_order': sampler.order.key} if sampler.order is not None else {}
    return {**length, **order, 'batch_size': sampler.batch_size, 'epoch_samples': sampler.length,
            'samples_in_epoch': sampler.samples_before(inner_iter) if inner_iter else 0}


def plan(trainer, meta, path):
    """The :class:`ResumePoint` of a resume from a checkpoint with ``meta``: a function of the
    epoch's record (``samples_in_epoch``) and this run's loader, whatever shapes the epoch was
    trained in before. CheckpointError for a position out of range; ConfigError for a mid-epoch
    change a loader cannot follow (without ``resume_policy='restart_epoch'``)."""
    epoch, it, inner = meta['epoch'], meta['iter'], meta['inner_iter']
    keep = ResumePoint(epoch, it, inner, None, '')
    if trainer.train_dataloader is None:
        check_position(meta, path)
        return keep
    saved_ipe, ipe, world = meta.get('iters_per_epoch'), trainer.iters_per_epoch, trainer.world_size
    sampler, per_epoch = elastic_sampler(trainer), trainer.train_stream.per_epoch
    check_position(meta, path, ipe if per_epoch else None)
    samples = meta.get('samples_in_epoch')
    if sampler is not None and meta.get('epoch_samples', sampler.length) != sampler.length:
        samples = None  # another dataset: another order, so the saved position names other samples
    order = sampler.order.key if sampler is not None and sampler.order is not None else None
    if sampler is not None and meta.get('data_order') != order:
        trainer.logger.warning("%s was trained on the order of %s, this run's loader shuffles with %s: the epoch's "
                               'samples are not those of the checkpointed run', path,
                               meta.get('data_order') or "hookloop's seed", order or "hookloop's seed")
        samples = None
    if sampler is None or saved_ipe is None or samples is None or (inner and 'epoch_samples' not in meta):
        return _without_record(trainer, meta, path, keep, sampler, per_epoch)
    new_inner = sampler.batch_after(samples)
    same_shape = meta.get('batch_size') == sampler.batch_size and meta.get('world_size', world) == world
    if new_inner == inner and saved_ipe == ipe:
        note = '' if same_shape else _note(meta, path, sampler, world, ipe, samples, it, it, new_inner)
        return ResumePoint(epoch, it, inner, samples, note)
    if inner == 0 and samples == 0:
        return _at_boundary(meta, path, ipe, world)
    new_iter = epoch * ipe + new_inner
    return ResumePoint(epoch, new_iter, new_inner, samples,
                       _note(meta, path, sampler, world, ipe, samples, it, new_iter, new_inner))


def _without_record(trainer, meta, path, keep, sampler, per_epoch):
    """A checkpoint or loader without the epoch's record: continue at the saved batch when the
    epoch's shape is unchanged; else refuse mid-epoch (or restart the epoch) and re-base at a boundary."""
    epoch, inner, saved_ipe, ipe = meta['epoch'], meta['inner_iter'], meta.get('iters_per_epoch'), trainer.iters_per_epoch
    world = trainer.world_size
    if sampler is not None and saved_ipe == ipe and meta.get('world_size', world) == world and \
            meta.get('batch_size', sampler.batch_size) == sampler.batch_size:
        return keep
    if not per_epoch and not isinstance(getattr(trainer.train_dataloader, 'batch_sampler', None),
                                        ResumableBatchSampler):
        return keep  # a stream carries its own position (train_stream.py)
    restart = check_epoch_length(meta, ipe, world, trainer.resume_policy, path)  # refuses a mid-epoch change
    if restart is not None:
        return ResumePoint(*restart, None, f"resume_policy='restart_epoch': {path} has {saved_ipe} batches per "
                                           f'epoch, this run {ipe}; continuing from the start of epoch '
                                           f'{restart[0] + 1} (iteration {restart[1]})')
    if (per_epoch or sampler is not None) and inner == 0 and saved_ipe not in (None, ipe):
        return _at_boundary(meta, path, ipe, world)
    return keep


def _note(meta, path, sampler, world, ipe, samples, it, new_iter, new_inner):
    rebased = f'; iteration {it} is re-based to {new_iter}' if new_iter != it else ''
    rest = sampler.length - samples
    if not rest:
        return (f'{path} ends epoch {meta["epoch"] + 1} ({_shape(meta)} then, {_shape_now(sampler, world, ipe)} '
                f'now){rebased}')
    dropped = _dropped(sampler, samples)
    return (f'{path} stopped after {samples} of the {sampler.length} samples of epoch {meta["epoch"] + 1} '
            f'({_shape(meta)} then, {_shape_now(sampler, world, ipe)} now): the other {rest} are shared out over '
            f'{world} rank(s) in batches of {sampler.batch_size}, as batches {new_inner}..{ipe - 1} of the '
            f'epoch{dropped}{rebased}')


def _dropped(sampler, samples):
    """`` (drop_last: the last N ... are not trained in this epoch)`` when the re-split rest does
    not fill its last batch (or is cut to a multiple of the ranks)."""
    rest = sampler.length - samples
    trained = sampler.remaining_batches(samples) * sampler.batch_size * sampler.world_size \
        if sampler.drop_last else (rest // sampler.world_size * sampler.world_size if sampler.shard_drop_last else rest)
    trained = min(trained, rest)
    if trained >= rest:
        return ''
    return (f' (drop_last: the last {rest - trained} samples of its order, positions {samples + trained}..'
            f'{sampler.length - 1}, are not trained in this epoch)')


def _at_boundary(meta, path, ipe, world):
    epoch = meta['epoch']
    note = (f'{path} ends epoch {epoch} ({_shape(meta)} then, {ipe} batches per epoch on {world} rank(s) '
            f'now): epoch {epoch + 1} starts at its first batch and iteration {meta["iter"]} is re-based to '
            f'{epoch * ipe}, where a run with the new setting starts it')
    return ResumePoint(epoch, epoch * ipe, 0, None, note)


def _shape(meta):
    batch = f'batch {meta["batch_size"]}, ' if 'batch_size' in meta else ''
    return f'{batch}{meta.get("iters_per_epoch", "?")} batches per epoch on {meta.get("world_size", "?")} rank(s)'


def _shape_now(sampler, world, ipe):
    return f'batch {sampler.batch_size}, {ipe} batches per epoch on {world} rank(s)'


def apply(trainer, point):
    """After the trainer's position and data stream were loaded: move them to ``point``."""
    position = trainer.position
    position.epoch, position.iter, position.inner_iter = point.epoch, point.iter, point.inner_iter
    sampler = elastic_sampler(trainer) if point.start_sample is not None else None
    if sampler is not None:
        sampler.start_at(point.epoch, point.start_sample)
