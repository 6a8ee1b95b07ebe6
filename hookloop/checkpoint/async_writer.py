"""Checkpoints written in the background while training goes on.

At the save point the checkpoint's tensors are copied into a *staging* copy in CPU memory
(pinned when they come from CUDA, so the copy is a fast DMA); a background thread then
writes the staged copy with the same crash-safety as a synchronous save (temporary file,
fsync, rename, then the ``last_checkpoint`` pointer). The training loop only waits for
the copy.

* One save in flight at a time: the next save waits for the previous write first.
* The staging buffers are reused from one save to the next (same keys, shapes and dtypes),
  so the extra memory is one copy of the checkpoint, not one per save.
* A failed background write is raised (as a ``CheckpointError``) by the next
  :meth:`AsyncCheckpointWriter.wait` — the next save, or the end of the run.
* What must wait for the file to be on disk (removing old checkpoints, replacing the best
  one) is handed over as ``on_disk`` and run by that :meth:`~AsyncCheckpointWriter.wait`, on
  the training thread, only when the write succeeded: a failed write leaves the previous
  ``last`` and best files in place.
* The staged copy is a deep snapshot taken at the save point: tensors go to the staging
  buffers, containers (dicts, lists, tuples, sets) are rebuilt, any other object is
  deep-copied, so nothing a hook changes later reaches the file.
* Under FSDP the shards go through ``torch.distributed.checkpoint.async_save`` (which stages
  them itself) on a process group of their own; ``hookloop.pth`` and the pointer are written
  when every rank's shards are on disk (``hookloop/dist/fsdp.py``).
"""
import copy as copying
import threading
from collections.abc import Mapping

import torch

from ..errors import CheckpointError


class AsyncCheckpointWriter:
    """Stages checkpoints to CPU memory and writes them on a background thread."""

    def __init__(self):
        self._thread = None
        self._error = None
        self._on_disk = None  # what runs once the write in flight has succeeded
        self._sharded = None  # (future of dcp.async_save, finish) for an FSDP save in flight
        self.process_group = None  # FSDP: the gloo group the background writes coordinate over
        self._staging = {}  # path in the checkpoint tree -> reusable CPU tensor
        self.staging_allocations = 0  # buffers ever allocated (equal to len(_staging) when all are reused)

    def wait(self):
        """Block until the save in flight (if any) is written; raise its error, once."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._sharded is not None:
            (future, finish), self._sharded = self._sharded, None
            try:
                future.result()  # this rank's shards
                finish()  # collective: the metadata file and the pointer, after every rank's shards
            except Exception as exc:  # noqa: BLE001 - raised below as a CheckpointError
                self._error = exc
        error, self._error = self._error, None
        on_disk, self._on_disk = self._on_disk, None
        if error is None and on_disk is not None:
            on_disk()
        if error is not None:
            if isinstance(error, CheckpointError):
                raise CheckpointError(f'a background checkpoint save failed: {error}') from error
            raise CheckpointError(f'a background checkpoint save failed: {error!r}') from error

    # -- staging -----------------------------------------------------------------------------
    def stage(self, checkpoint):
        """A copy of ``checkpoint`` whose tensors live in this writer's reused CPU buffers.

        Tensors that appear twice in ``checkpoint`` (by identity) stay shared in the copy."""
        seen = {}
        used = set()

        def copy(value, key):
            if isinstance(value, torch.Tensor):
                if id(value) in seen:
                    return seen[id(value)]
                source = value.detach()
                if source.layout != torch.strided:  # sparse and other layouts: a fresh copy
                    seen[id(value)] = source.to('cpu', copy=True)
                    return seen[id(value)]
                buffer = self._staging.get(key)
                if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
                    pin = source.is_cuda and torch.cuda.is_available()
                    buffer = torch.empty(source.shape, dtype=source.dtype, device='cpu', pin_memory=pin)
                    self._staging[key] = buffer
                    self.staging_allocations += 1
                buffer.copy_(source, non_blocking=source.is_cuda)
                used.add(key)
                seen[id(value)] = buffer
                return buffer
            if isinstance(value, Mapping):
                return {k: copy(v, key + (k,)) for k, v in value.items()}
            if isinstance(value, tuple):
                return tuple(copy(v, key + (i,)) for i, v in enumerate(value))
            if isinstance(value, list):
                return [copy(v, key + (i,)) for i, v in enumerate(value)]
            if isinstance(value, (set, frozenset)):
                return type(value)(copy(v, key + ('set',)) for v in value)
            if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
                return value  # immutable
            return copying.deepcopy(value)  # any other object: its values at the save point

        staged = copy(checkpoint, ())
        for key in set(self._staging) - used:  # entries gone from this checkpoint: free them
            del self._staging[key]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are complete
        return staged

    # -- writing -----------------------------------------------------------------------------
    def submit(self, write, *args, on_disk=None):
        """Run ``write(*args)`` on a background thread, after the previous save finished;
        ``on_disk()`` runs in the :meth:`wait` that finds it written without error."""
        self.wait()
        self._on_disk = on_disk

        def run():
            try:
                write(*args)
            except BaseException as exc:  # noqa: B902 - kept and raised by the next wait()
                self._error = exc

        self._thread = threading.Thread(target=run, name='hookloop-checkpoint-writer', daemon=False)
        self._thread.start()

    def submit_sharded(self, future, finish):
        """Track an FSDP save started with ``torch.distributed.checkpoint.async_save`` (which
        staged the shards to CPU memory itself): :meth:`wait` waits for ``future`` and then
        calls ``finish()`` on every rank."""
        self._sharded = (future, finish)

    def defer(self, on_disk):
        """Run ``on_disk()`` in the :meth:`wait` that finds the save in flight written."""
        self._on_disk = on_disk
