"""The engine's side of the weights gate (``hookloop/checkpoint/gate.py``): the run's baseline of
values non-finite by design, and the entry points hooks and compat layers write exported weights
through (``trainer.checkpointer.export_file`` / ``export_directory``, docs/checkpoints.md).

:class:`WeightGate` is the :class:`~hookloop.engine.checkpointer.Checkpointer`'s base: the
checkpoints it writes are judged against the same baseline.
"""
import weakref

from ..checkpoint import gate
from ..checkpoint.finite_state import FiniteBaseline
from ..fileio import storage


class WeightGate:
    """``baseline``: what was non-finite by design when the run started
    (:class:`~hookloop.checkpoint.finite_state.FiniteBaseline`; None before a run)."""

    def __init__(self, trainer):
        self._trainer = weakref.proxy(trainer)  # the trainer owns this: no cycle that keeps a dropped one alive
        self.baseline = self._baseline_model = None

    def trained_state(self, save_optimizer=True):
        """What training produces, the part of a checkpoint the finite check judges: the model's
        weights (``state_dict``), the hooks' states (``hooks``) and the optimizer's (``optimizer``)."""
        t = self._trainer
        state = {'state_dict': t.model.state_dict(),
                 'hooks': {hook.name: hook.state_dict() for hook in t.hooks if hasattr(hook, 'state_dict')}}
        if save_optimizer and t.optimizer is not None:
            state['optimizer'] = t.optimizer.state_dict()
        return state

    def take_baseline(self):
        """Note what of the state is non-finite now, as the run starts (after ``before_run``:
        a causal mask's ``-inf``, a hook's ``best = inf``): saves and exports accept those
        values where they are, and refuse any other NaN/inf. Taken once per model: a later
        ``train()`` of the same trainer keeps the first run's baseline; a save before any run
        takes it then (nothing has trained yet)."""
        t = self._trainer
        if self.baseline is None or self._baseline_model is not t.model:
            self.baseline, self._baseline_model = FiniteBaseline.of(self.trained_state()), t.model
            gate.remember_baseline(t.model, self.baseline)
            if self.baseline:
                t.logger.debug('non-finite by design at the start (saves keep them as they are): %s',
                               ', '.join(self.baseline.names()))
        return self.baseline

    def export_file(self, path, write, state):
        """Write one file of trained weights through the gate: ``state`` (a mapping, possibly
        nested, of the tensors the file holds, e.g. ``model.state_dict()``) is checked for NaN/inf
        beyond the run's baseline (one-line ``InvalidLossError``, nothing written), then
        ``write(fileobj)`` writes the bytes to a temporary that gets its checksum sidecar and is
        renamed into place. ``path``: relative to the work dir, or an absolute path / URL. No
        collective: rank 0 alone may call it. Returns the written path."""
        path = self._trainer.workspace.join(path)
        gate.check_weights(state, path, self.take_baseline())
        storage.makedirs(storage.dirname(path))
        return gate.write_file(path, write, 'weights')

    def export_directory(self, path, write, state):
        """Like :meth:`export_file` for a whole directory: ``write(tmp_dir)`` fills a temporary
        sibling of ``path`` (e.g. ``lambda d: pipe.save_pretrained(d)``), each file gets its
        checksum sidecar, and the directory is swapped into place. Returns the written path."""
        path = self._trainer.workspace.join(path)
        gate.check_weights(state, path, self.take_baseline())
        return gate.write_directory(path, write, 'weights directory')


__all__ = ['WeightGate']
