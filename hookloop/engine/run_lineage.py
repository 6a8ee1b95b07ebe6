"""A run in its lineage of resumes: what every checkpoint records of the run that wrote it, and
the names its checkpoints take.

A work dir holds the checkpoints of a lineage of runs, each resumed from a checkpoint of an
earlier one (or fresh runs one after another). ``meta['run']`` says which run wrote a
checkpoint: ``first_started``, when its lineage began (a fresh run's start, inherited by its
resumes), its ``count`` in it (1 for a fresh run, the checkpoint's count + 1 for a resume) and
its own ``started`` time. ``--resume auto`` orders checkpoints by these, then by position
(``hookloop/checkpoint/resume_search.py``), never by their names: the newest lineage first,
within it the newest run whatever the clocks of the machines it ran on, then its furthest
position. Names cannot say this: a resume that re-based the iteration counter (another batch size) or continued
from an older checkpoint reaches names an older run used. Those names are not overwritten: the
newer run's file is ``<stem>.run<count><ext>`` (``iter_7.run2.pth``) instead.
"""
import os
import time
from collections.abc import Mapping

from ..checkpoint.resume_position import is_count
from ..dist.process_group import broadcast_object
from ..fileio import storage


class RunLineage:
    """This trainer's run: ``count``, ``started`` (``time.time()`` at its first ``train()``, the
    same on every rank), ``first_started`` (its lineage's) and the checkpoint files it wrote,
    which it may write again."""

    def __init__(self):
        self.count, self.started, self.first_started = 1, None, None
        self._written = set()

    def meta(self):
        """What a checkpoint records of the run that wrote it (``meta['run']``)."""
        return {'first_started': self.first_started, 'count': self.count, 'started': self.started}

    def start(self):
        """The first ``train()`` of the trainer (a later one after a stop continues the run)."""
        if self.started is None:
            self.started = broadcast_object(time.time())
            self.first_started = self.started if self.first_started is None else self.first_started

    def resumed_from(self, meta):
        """A resume from a checkpoint with ``meta`` starts the next run of its lineage, now."""
        saved = meta.get('run')
        saved = saved if isinstance(saved, Mapping) else {}
        count, first = saved.get('count'), saved.get('first_started')
        self.count = count + 1 if is_count(count) and count > 0 else 2
        self.started = broadcast_object(time.time())
        valid = isinstance(first, (int, float)) and not isinstance(first, bool)
        self.first_started = first if valid else self.started
        self._written = set()

    def wrote(self, path):
        self._written.add(path)

    def unclaimed(self, path, rank, world_size):
        """``path`` (absolute or a URL) unless a file there was written by an earlier run, then
        the first free of ``<stem>.run<count><ext>``, ``<stem>.run<count>.<k><ext>``: decided on
        rank 0, for every rank."""
        if rank == 0 and path not in self._written and storage.exists(path):
            stem, ext = os.path.splitext(path)
            tag = f'{stem}.run{self.count}'
            path = next(name for name in (f'{tag}{ext}', *(f'{tag}.{k}{ext}' for k in range(1, 1000)))
                        if name in self._written or not storage.exists(name))
        return broadcast_object(path) if world_size > 1 else path


__all__ = ['RunLineage']
