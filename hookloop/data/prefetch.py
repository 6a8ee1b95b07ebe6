"""Device prefetch: on CUDA the next batch is copied to the GPU while the current step runs.

:class:`DevicePrefetcher` wraps the epoch's batch iterator. It keeps one batch ahead: the
batch is pinned (unless the loader already pins, ``pin_memory=True``) and copied with
``non_blocking=True`` on a side stream; handing it out makes the compute stream wait for
that copy, and ``record_stream`` keeps the caching allocator from reusing its memory early.
On the CPU (and with ``Trainer(device_prefetch=False)``) the trainer does not use it.

It reads one batch ahead of the loop, so it is not used for loaders that checkpoint their
own position (``state_dict()``, e.g. torchdata's ``StatefulDataLoader``): their saved
state would include the batch fetched ahead.
"""
import torch

from .device import move_to_device


def _pinned(batch):
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_pinned() or batch.device.type != 'cpu' else batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pinned(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, '_fields'):
        return type(batch)(*(_pinned(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pinned(v) for v in batch)
    return batch


def _record_stream(batch, stream):
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, dict):
        for value in batch.values():
            _record_stream(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record_stream(value, stream)


def uses_prefetch(device, loader, enabled=True):
    """Whether the trainer prefetches for ``loader`` on ``device``."""
    return enabled and torch.device(device).type == 'cuda' and torch.cuda.is_available() \
        and not callable(getattr(loader, 'state_dict', None))


class DevicePrefetcher:
    """An iterator over ``batches`` moved to the CUDA ``device``, one batch ahead."""

    def __init__(self, batches, device):
        self.batches, self.device = batches, torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self._next = None
        self._exhausted = False
        self._preload()

    def _preload(self):
        try:
            batch = next(self.batches)
        except StopIteration:
            self._exhausted, self._next = True, None
            return
        with torch.cuda.stream(self.stream):
            self._next = move_to_device(_pinned(batch), self.device)

    def __iter__(self):
        return self

    def __next__(self):
        if self._exhausted:
            raise StopIteration
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)  # the copy is done before the step reads the batch
        batch = self._next
        _record_stream(batch, current)
        self._preload()
        return batch
