"""The resume position a checkpoint records, range-checked before anything is restored.

A checkpoint's ``meta`` says where its run stood (``epoch``, ``iter``, ``inner_iter``, the
epoch's record ``samples_in_epoch`` with the ``batch_size`` / ``world_size`` / ``epoch_samples``
it was trained with) and the run's own length (``iters_per_epoch``, ``max_iters``,
``max_epochs``). A damaged or edited (and re-sealed) file may hold anything there: a negative
iteration, a position past the run's end, a fraction, a string. Each field is checked against
the others of the same checkpoint and against the loader resuming it, and a bad one is refused
in one line naming the checkpoint and the field, before the run trains on it.
"""
from ..errors import CheckpointError

# meta fields that count something, each >= its minimum when present
COUNTS = {'epoch': 0, 'iter': 0, 'inner_iter': 0, 'samples_in_epoch': 0, 'epoch_samples': 1, 'batch_size': 1,
          'world_size': 1, 'iters_per_epoch': 1, 'max_iters': 1, 'max_epochs': 1}


def is_count(value):
    return isinstance(value, int) and not isinstance(value, bool)


def refuse(path, field, value, why, entry='meta'):
    """CheckpointError: ``path``'s ``entry[field]`` holds ``value``, which is ``why`` wrong."""
    raise CheckpointError(f"{path}: its {entry}[{field!r}] is {value!r}, {why}: the checkpoint is damaged or was "
                          'edited; refusing to resume from it')


def check_position(meta, path, loader_batches=None):
    """CheckpointError naming ``path`` and the field when a position field of ``meta`` is not a
    whole number in its range: ``inner_iter`` within the run's epoch (``iters_per_epoch``),
    ``iter`` within ``max_iters`` and at least ``inner_iter``, ``epoch`` within ``max_epochs``,
    ``samples_in_epoch`` within ``epoch_samples``. ``loader_batches`` (the resuming loader's
    batches per epoch, None when unknown) bounds ``inner_iter`` when the epoch's length is
    unchanged."""
    for field, least in COUNTS.items():
        value = meta.get(field)
        if value is None and field not in ('epoch', 'iter', 'inner_iter'):
            continue
        if not is_count(value):
            refuse(path, field, value, 'not a whole number')
        if value < least:
            refuse(path, field, value, f'below {least}')
    epoch, iteration, inner = meta['epoch'], meta['iter'], meta['inner_iter']
    saved_batches = meta.get('iters_per_epoch')
    if saved_batches is not None and inner > saved_batches:
        refuse(path, 'inner_iter', inner, f'outside 0..{saved_batches} (the batches per epoch of the run that wrote it)')
    if inner > iteration:
        refuse(path, 'iter', iteration, f'fewer than the iterations done in its epoch (inner_iter {inner})')
    if meta.get('max_iters') is not None and iteration > meta['max_iters']:
        refuse(path, 'iter', iteration, f'past the end of the run that wrote it (max_iters {meta["max_iters"]})')
    if meta.get('max_epochs') is not None and epoch > meta['max_epochs']:
        refuse(path, 'epoch', epoch, f'past the end of the run that wrote it (max_epochs {meta["max_epochs"]})')
    samples, size = meta.get('samples_in_epoch'), meta.get('epoch_samples')
    if samples is not None and size is not None and samples > size:
        refuse(path, 'samples_in_epoch', samples, f'more than the {size} samples of an epoch of the run that wrote it')
    if loader_batches is not None and saved_batches == loader_batches and inner > loader_batches:
        refuse(path, 'inner_iter', inner, f'outside 0..{loader_batches} (the batches per epoch of the loader)')


__all__ = ['check_position', 'is_count', 'refuse']
