"""Epoch orders drawn from a user's ``torch.Generator``, as torch's ``RandomSampler`` draws them,
at any epoch.

``DataLoader(ds, shuffle=True, generator=g)`` shuffles with ``g``: each epoch the loader's iterator
first draws its base seed from ``g`` (one int64; once for all epochs with persistent workers), then
``RandomSampler`` draws ``torch.randperm(n, generator=g)``, the epoch's order, and, when the pass is
read to its end, one more for its ``num_samples % n`` tail (empty, but drawn). hookloop rebuilds such a loader around its
resumable sampler (:mod:`hookloop.data.resumable`); to keep the user's order it replays those draws
from the generator's state as the loader was handed over, so epoch ``e``'s order is a pure
function of that state and ``e`` (resumable, like hookloop's own ``(seed, epoch)`` orders) and
equals the plain loop's. The user's generator itself is never advanced.
"""
import hashlib

import torch


class GeneratorOrder:
    """The orders a ``RandomSampler`` (without replacement, one pass per epoch) draws from
    ``generator``, epoch after epoch.

    Args:
        generator: the sampler's CPU ``torch.Generator``, in the state the user gave it.
        loader_draws: True when the DataLoader's iterator draws its base seed from the same
            generator before the sampler's permutation (``DataLoader(shuffle=True, generator=g)``).
        persistent: the loader keeps its iterator across epochs (``persistent_workers``), so
            that draw happens in the first epoch only.
    """

    def __init__(self, generator, loader_draws=False, persistent=False):
        state = generator.get_state()
        self.loader_draws, self.persistent = loader_draws, persistent
        self._states = {0: state}  # epoch -> the generator's state when the epoch begins (0 and the latest)
        # What a checkpoint records of this order: a resume on a differently seeded generator is told.
        self.key = 'generator ' + hashlib.sha256(state.numpy().tobytes()).hexdigest()[:16]

    def order(self, epoch, length):
        """Epoch ``epoch``'s permutation of ``range(length)``."""
        start = max(e for e in self._states if e <= epoch)
        generator = torch.Generator()
        generator.set_state(self._states[start])
        for current in range(start, epoch + 1):
            if self.loader_draws and (current == 0 or not self.persistent):
                torch.empty((), dtype=torch.int64).random_(generator=generator)  # the iterator's base seed
            permutation = torch.randperm(length, generator=generator)
            # RandomSampler's last line draws the partial permutation of num_samples % n (none here)
            # when the pass is read to its end, as a loader always reads it: a second randperm.
            torch.randperm(length, generator=generator)
        self._states = {0: self._states[0], epoch + 1: generator.get_state()}  # the next epoch is one step away
        return permutation.tolist()


def generator_order(loader, sampler):
    """A :class:`GeneratorOrder` for ``sampler`` (a ``RandomSampler`` of ``loader``) when it
    shuffles with a CPU generator of the user's, else None (hookloop's seeded order)."""
    generator = getattr(sampler, 'generator', None)
    if not isinstance(generator, torch.Generator) or generator.device.type != 'cpu':
        return None
    persistent = bool(getattr(loader, 'persistent_workers', False)) and getattr(loader, 'num_workers', 0) > 0
    return GeneratorOrder(generator, loader_draws=getattr(loader, 'generator', None) is generator,
                          persistent=persistent)


__all__ = ['GeneratorOrder', 'generator_order']
