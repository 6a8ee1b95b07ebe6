"""How long a run is: iterations per epoch, ``max_epochs`` and ``max_iters`` from the train
loader and the arguments, and the train stream that yields its batches. A loader replaced in
the middle of an epoch (between two ``train()`` calls) continues the epoch from its record
(:func:`hookloop.engine.elastic_resume.continue_epoch`)."""
import math

from ..data.prefetch import DevicePrefetcher, uses_prefetch
from ..data.train_stream import TrainStream, dataset_name
from ..errors import ConfigError, DataError
from .elastic_resume import continue_epoch, epoch_record


def plan_run_length(trainer, given_iters_per_epoch):
    """Set ``trainer.iters_per_epoch``, the run length it lacks (``max_iters`` of an epoch-based
    run, ``max_epochs`` of an iteration-based one) and ``trainer.train_stream``.
    ``given_iters_per_epoch``: the ``iters_per_epoch`` argument (None: the loader's length)."""
    loader = trainer.train_dataloader
    record = epoch_record(trainer)  # a loader replaced mid-epoch: where the old one stands in its epoch
    if loader is None:
        trainer.iters_per_epoch = 0
        return
    try:
        length = len(loader)
    except TypeError:  # a stream: its length is unknown
        length = None
    if length == 0:
        raise DataError(f'train_dataloader is empty: {len(loader.dataset) if hasattr(loader, "dataset") else "?"} '
                        f'samples give no batch (check batch_size and drop_last)')
    trainer.iters_per_epoch = given_iters_per_epoch or length
    if trainer.iters_per_epoch is None:
        if trainer.by_epoch:
            raise ConfigError(f'train_dataloader ({dataset_name(loader)}) has no length, so max_epochs cannot '
                              'tell where an epoch ends: train with max_iters=..., or give iters_per_epoch=...')
        trainer.iters_per_epoch = trainer.max_iters
    per_epoch = given_iters_per_epoch is None and length is not None  # one pass per epoch
    prefetch = uses_prefetch(trainer.device, loader, trainer.device_prefetch)  # then to_device is a no-op
    trainer.train_stream = TrainStream(loader, trainer.seed, trainer.rank, trainer.world_size, per_epoch,
                                       trainer.logger,
                                       wrap_batches=(lambda batches: DevicePrefetcher(batches, trainer.device))
                                       if prefetch else None)
    if trainer.by_epoch:
        trainer.max_iters = trainer.max_epochs * trainer.iters_per_epoch
    else:
        trainer.max_epochs = math.ceil(trainer.max_iters / trainer.iters_per_epoch)
    continue_epoch(trainer, record)


__all__ = ['plan_run_length']
