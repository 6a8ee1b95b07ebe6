"""The train loader as the loop sees it: batches one at a time, in passes, at a position a
checkpoint stores and a resume restores.

Two shapes of run:

* ``per_epoch`` — the loader has a length and no ``iters_per_epoch`` was given: each trainer
  epoch is one pass (pass index = epoch), opened at the epoch's start and closed at its end.
  A pass that ends before the loader's length is an error.
* continuous — a loader without a length (a stream), or any loader with ``iters_per_epoch``:
  one iterator runs across trainer epochs; when a pass ends, the next starts (``set_epoch``
  with the new pass index). A pass that yields nothing is an error, so an empty or spent
  stream never hangs the run.

How a mid-pass position is restored is :func:`hookloop.data.stream_state.resume_plan`'s choice.
"""
import contextlib
import time
import warnings

from ..checkpoint.resume_position import is_count, refuse
from ..checkpoint.rng import get_rng_state, set_rng_state
from .resumable import SeededDataset, set_loader_epoch
from .stream_state import resume_plan
from ..dist.process_group import all_gather_objects
from ..errors import CheckpointError, DataError
from .hf_dataset import state_mismatch


def dataset_name(loader):
    """The user's dataset class name (through hookloop's wrapper), or the loader's."""
    dataset = getattr(loader, 'dataset', None)
    if dataset is None:
        return type(loader).__name__
    return type(dataset.dataset if isinstance(dataset, SeededDataset) else dataset).__name__


def _one_line(exc):
    """An exception as ``Type: last line`` (a worker's error carries its whole traceback)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    detail = lines[-1].strip() if lines else ''
    name = type(exc).__name__
    return detail if detail.startswith(name + ':') else f'{name}: {detail}' if detail else name


def _failing_sample(loader, batch_number):
    """`` (dataset index N)``: the first sample of the failed batch that raises when read again
    in this process (map-style data with hookloop's batch sampler only; '' otherwise). Runs
    only after an error, so the loop pays nothing for it."""
    from .resumable import ResumableBatchSampler
    sampler, dataset = getattr(loader, 'batch_sampler', None), getattr(loader, 'dataset', None)
    if not isinstance(sampler, ResumableBatchSampler) or not hasattr(dataset, '__getitem__'):
        return ''
    try:
        batch = sampler.indices()[batch_number * sampler.batch_size:(batch_number + 1) * sampler.batch_size]
    except Exception:  # noqa: BLE001 - a best-effort detail of an error message
        return ''
    for index in batch:
        try:
            dataset[index]
        except Exception:  # noqa: BLE001
            return f' (dataset index {int(index)})'
    return ''


@contextlib.contextmanager
def _global_rng_untouched():
    """Creating an iterator draws worker seeds from the global RNG, and fast-forwarding may
    run augmentations: neither may move the RNG that training (dropout, ...) continues from,
    or a resumed run would part from an uninterrupted one."""
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


class TrainStream:
    """Batches of ``loader`` for the training loop, with a resumable position."""

    def __init__(self, loader, seed, rank=0, world_size=1, per_epoch=True, logger=None, name='train_dataloader',
                 wrap_batches=None):
        self.loader, self.seed, self.rank, self.world_size = loader, seed, rank, world_size
        # Applied to each pass's iterator on the sampler path (the CUDA device prefetcher).
        self.wrap_batches = wrap_batches
        self.per_epoch = per_epoch
        self.logger, self.name = logger, name
        self.way, self.owner, self.reason = resume_plan(loader)
        self.pass_index = 0
        self.batches_in_pass = 0  # batches taken from the current pass (the next one's index)
        self._batches = None  # the live iterator
        self._saved_state = None  # a checkpoint's loader state, loaded when the next iterator opens
        self._restored = False  # the live iterator continues a saved pass (it may have nothing left)

    # -- the loop's side ----------------------------------------------------------------
    def begin_epoch(self, epoch, inner_iter):
        """Called at the start of each trainer epoch (before ``before_train_epoch``)."""
        if self.per_epoch:
            self._batches = None
            self.pass_index, self.batches_in_pass = epoch, inner_iter
            set_loader_epoch(self.loader, self.seed, epoch, self.rank, inner_iter)

    def end_epoch(self):
        """Called when a trainer epoch's loop ends: a per-epoch pass is closed, which shuts its
        workers down before the epoch-end hooks (validation has its own)."""
        if self.per_epoch:
            self._batches = None

    def close(self):
        self._batches = None

    def next_batch(self):
        if self._batches is None:
            self._open()
        while True:
            try:
                batch = next(self._batches)
            except StopIteration:
                self._pass_ended()
                continue
            except Exception as exc:
                raise DataError(f'{self.name}: {dataset_name(self.loader)} raised while loading batch '
                                f'{self.batches_in_pass}{_failing_sample(self.loader, self.batches_in_pass)} of pass '
                                f'{self.pass_index}: {_one_line(exc)}') from exc
            self.batches_in_pass += 1
            self._restored = False
            return batch

    def _pass_ended(self):
        restored, self._batches = self._restored, None
        if restored and (self.batches_in_pass > 0 or self.per_epoch):
            # The saved pass had nothing left (saved after its last batch): go on with a fresh one.
            if not self.per_epoch:
                self.pass_index, self.batches_in_pass = self.pass_index + 1, 0
            self._open()
            self._restored = False  # once: a reopened pass that ends at once is judged as any other
            return
        if self.batches_in_pass == 0:
            raise DataError(f'{self.name} ({dataset_name(self.loader)}) yielded no batch in pass {self.pass_index}: '
                            'the stream is empty' + (' (an iterator can be read only once: pass something '
                                                     'that can be iterated again)' if self.pass_index else ''))
        if self.per_epoch:
            raise DataError(f'{self.name} ended after {self.batches_in_pass} batches but reported '
                            f'{len(self.loader)}')
        self.pass_index, self.batches_in_pass = self.pass_index + 1, 0
        self._open()

    def _open(self):
        """Create the iterator of the current pass at ``batches_in_pass``."""
        start = self.batches_in_pass
        set_loader_epoch(self.loader, self.seed, self.pass_index, self.rank, start)
        if self.way == 'sampler':
            batches = iter(self.loader)
            self._batches = self.wrap_batches(batches) if self.wrap_batches else batches
            self._restored = start > 0
            return
        with _global_rng_untouched():
            from_state = self._saved_state is not None
            if from_state:
                dataset = getattr(self.loader, 'dataset', None)
                mismatch = state_mismatch(dataset, self._saved_state, getattr(self.loader, 'num_workers', 0) > 0)
                if mismatch:
                    raise CheckpointError(f'the checkpoint\'s state of {self.name} ({dataset_name(self.loader)}) '
                                          f'cannot be restored into this loader: {mismatch}')
                try:
                    self.owner.load_state_dict(self._saved_state)
                    self._batches = iter(self.loader)
                except Exception as exc:
                    raise CheckpointError(f'the checkpoint\'s state of {self.name} ({dataset_name(self.loader)}) '
                                          f'cannot be restored into this loader (was the data changed, e.g. '
                                          f'its shards?): {_one_line(exc)}') from exc
                finally:
                    self._saved_state = None
            else:
                self._batches = iter(self.loader)
            self._restored = from_state or start > 0
            if start and not from_state:
                self._fast_forward(start)

    def _fast_forward(self, count):
        why = f' ({self.reason})' if self.reason else ''
        message = (f'{self.name} resumes by reading and dropping the first {count} batches of pass '
                   f'{self.pass_index}{why}: that costs as much as loading them')
        warnings.warn(message, stacklevel=3)
        if self.logger is not None:
            self.logger.warning(message)
        begin = time.perf_counter()
        for index in range(count):
            try:
                next(self._batches)
            except StopIteration:
                raise DataError(f'{self.name} ended after {index} batches while fast-forwarding to batch {count} '
                                f'of pass {self.pass_index}: the data differs from the checkpointed run') from None
            except Exception as exc:
                raise DataError(f'{self.name}: {dataset_name(self.loader)} raised while loading batch {index} '
                                f'of pass {self.pass_index} (fast-forward): {_one_line(exc)}') from exc
        if self.logger is not None:
            self.logger.info('fast-forward over %d batches took %.2f s', count, time.perf_counter() - begin)

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self):
        """The position (and, for the ``'state'`` way, the loader's state), taken now: in a
        checkpoint saved after an iteration it already counts that iteration's batch."""
        state = {'pass': self.pass_index, 'batches_in_pass': self.batches_in_pass, 'way': self.way}
        if self.way == 'state':
            own = self._saved_state if self._saved_state is not None else self.owner.state_dict()
            # Every rank reads its own part of a stream: rank 0 writes all ranks' states.
            state['loader_state'] = all_gather_objects(own) if self.world_size > 1 else [own]
        return state

    def load_state_dict(self, state, epoch, inner_iter, source='the checkpoint'):
        """Restore a position saved by :meth:`state_dict`; the iterator opens at the next batch.
        ``epoch`` / ``inner_iter`` are the checkpoint's counters (a per-epoch pass follows them);
        ``source`` names the checkpoint in an error (a position that is not a count)."""
        self._batches = None
        if self.per_epoch:
            self.pass_index, self.batches_in_pass = epoch, inner_iter
        elif state is not None:
            if not isinstance(state, dict):
                raise CheckpointError(f'{source}: its "data" entry is not a dict: the checkpoint is damaged or was edited')
            for field in ('pass', 'batches_in_pass'):
                if not is_count(state.get(field)) or state[field] < 0:
                    refuse(source, field, state.get(field), 'not a count of passes or batches', entry='data')
            self.pass_index, self.batches_in_pass = state['pass'], state['batches_in_pass']
        else:
            raise CheckpointError(f'the checkpoint has no position for {self.name}, which has no length '
                                  '(or runs with iters_per_epoch): it was not written by this kind of run')
        loader_state = (state or {}).get('loader_state')
        if loader_state is not None:
            if len(loader_state) != self.world_size:
                raise CheckpointError(f'the checkpoint holds the state of {self.name} for {len(loader_state)} '
                                      f'ranks, this run has {self.world_size}: that stream cannot be resumed here')
            loader_state = loader_state[self.rank]
        if self.way == 'state' and loader_state is not None:
            self._saved_state = loader_state
        elif self.way == 'state':  # a checkpoint from a loader without state: _open fast-forwards
            self.reason = 'the checkpoint holds no state of it'
