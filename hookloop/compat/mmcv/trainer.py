"""The trainer of an MMCV-built run: what hooks receive as ``runner`` when the run comes from an
MMCV 1.x config (``build_trainer`` with ``runner=``, ``data=``, ...) or from the runner adapters
(``EpochBasedRunner`` / ``IterBasedRunner``).

It is the :class:`~hookloop.Trainer` with MMCV's runner methods, with MMCV's signatures and
defaults, so a repository's hook that calls them runs unchanged:

* ``save_checkpoint(out_dir, filename_tmpl=None, save_optimizer=True, meta=None,
  create_symlink=True)``: ``<out_dir>/epoch_<n>.pth`` (``iter_<n>.pth`` for an iteration-based
  run), the trainer's checkpoint (through its checkpoint writes, atomic, with a checksum) with
  the runner's ``meta`` and ``meta`` merged in, and ``latest.pth`` pointing at it. A file path
  as the first argument (``save_checkpoint('preempt_iter_5.pth', update_last=False)``, what
  hookloop's own hooks call) is the Trainer's own form;
* ``load_checkpoint(filename, map_location='cpu', strict=False, revise_keys=...)``: weights only;
* ``resume(checkpoint, resume_optimizer=True, map_location='default')``: an exact resume;
* ``call_hook(fn_name)`` for any method name (MMCV's ``call_hook('before_epoch')``);
* and the Trainer's ``current_lr``, ``current_momentum``, ``get_hook_info``, ``register_*``.

In an iteration-based run the hooks written for MMCV are called at the stages MMCV's
``IterBasedRunner`` calls (``before_epoch`` / ``after_epoch`` once, never the train-epoch
stages): :mod:`hookloop.compat.mmcv.iter_stages`.

It also keeps MMCV's habits: ``latest.pth`` beside each checkpoint the ``last_checkpoint``
pointer moves to (MMCV code resumes from it), the runner's ``meta`` in every checkpoint, and
``meta['hook_msgs']['last_ckpt']``.
"""
import os
import warnings

from ...checkpoint.format import load_checkpoint
from ...engine.checkpointer import plain
from ...engine.trainer import Trainer
from ...errors import ConfigError, ConfigTypeError
from ...fileio import storage
from ...registry import TRAINERS
from .iter_stages import apply_iter_runner_stages

LATEST_LINK = 'latest.pth'
_CHECKPOINT_SUFFIXES = ('.pth', '.pt', '.ckpt', '.bin', '.safetensors')


def link_latest(path):
    """Point ``<dir of path>/latest.pth`` at ``path`` (a relative symlink, replaced atomically),
    as MMCV's ``save_checkpoint(create_symlink=True)`` does."""
    directory = os.path.dirname(path)
    link, temporary = os.path.join(directory, LATEST_LINK), os.path.join(directory, f'.{LATEST_LINK}.tmp')
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(os.path.basename(path), temporary)
    os.replace(temporary, link)


@TRAINERS.register_module()
class MMCVTrainer(Trainer):
    """The Trainer of an MMCV-built run (see the module docstring).

    Args:
        iter_based_runner: the run is an ``IterBasedRunner``'s: checkpoints are named by
            iteration (``iter_{}.pth``).
        runner_meta: MMCV's ``runner.meta`` (a dict or None), stored in every checkpoint.
        kwargs: the Trainer's.
    """

    iter_based_runner = False
    runner_meta = None

    def __init__(self, *args, iter_based_runner=False, runner_meta=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.iter_based_runner = iter_based_runner
        self.meta = self.runner_meta = runner_meta

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self, save_optimizer=True, save_frozen=True):
        checkpoint = super().state_dict(save_optimizer, save_frozen)
        for key, value in plain(self.runner_meta or {}).items():
            checkpoint['meta'].setdefault(key, value)  # hookloop's own entries win
        return checkpoint

    def write_checkpoint(self, checkpoint, path, update_last=True, asynchronous=False, on_disk=None):
        path = super().write_checkpoint(checkpoint, path, update_last, asynchronous, on_disk)
        if update_last and self.meta is not None:  # MMCV's CheckpointHook: meta['hook_msgs']['last_ckpt']
            self.meta.setdefault('hook_msgs', {})['last_ckpt'] = path
        if update_last and self.rank == 0 and not storage.is_url(path):
            if asynchronous:  # latest.pth must never name a file still being written
                self.wait_for_checkpoint()
            link_latest(path)
        return path

    def save_checkpoint(self, out_dir, filename_tmpl=None, save_optimizer=True, meta=None, create_symlink=True,
                        update_last=None, asynchronous=False, on_disk=None):
        """MMCV's ``runner.save_checkpoint(out_dir, ...)``; returns the path written. A file path
        with none of MMCV's options is the Trainer's ``save_checkpoint(path, save_optimizer,
        update_last, asynchronous, on_disk)``."""
        if self._names_a_file(out_dir, filename_tmpl, meta):
            return super().save_checkpoint(out_dir, save_optimizer, True if update_last is None else update_last,
                                           asynchronous, on_disk)
        if meta is not None and not isinstance(meta, dict):
            raise ConfigTypeError(f'meta should be a dict or None, but got {type(meta).__name__}')
        if filename_tmpl is None:
            filename_tmpl = 'iter_{}.pth' if self.iter_based_runner else 'epoch_{}.pth'
        count = self.iter + 1 if self.iter_based_runner else self.epoch + 1
        path = storage.join(os.fspath(out_dir), filename_tmpl.format(count))
        if update_last is None:  # the pointer moves for a save into the work dir only (MMCV has none)
            update_last = storage.normalize(os.fspath(out_dir)) == storage.normalize(self.storage_dir)
        previous = self.runner_meta
        self.runner_meta = {**(previous or {}), **(meta or {})}
        try:
            checkpoint = self.build_checkpoint(save_optimizer=save_optimizer)
            path = Trainer.write_checkpoint(self, checkpoint, path, update_last, asynchronous, on_disk)
        finally:
            self.runner_meta = previous
        if update_last and self.meta is not None:
            self.meta.setdefault('hook_msgs', {})['last_ckpt'] = path
        if create_symlink and self.rank == 0 and not storage.is_url(path):
            if asynchronous:
                self.wait_for_checkpoint()
            link_latest(path)
        return path

    @staticmethod
    def _names_a_file(out_dir, filename_tmpl, meta):
        out_dir = os.fspath(out_dir)
        return filename_tmpl is None and meta is None and out_dir.endswith(_CHECKPOINT_SUFFIXES) and \
            not storage.isdir(out_dir)

    def load_checkpoint(self, filename, map_location='cpu', strict=False, revise_keys=((r'^module\.', ''),)):
        """MMCV's ``runner.load_checkpoint``: the weights only, keys renamed by ``revise_keys``
        first; returns the checkpoint."""
        return self.load_weights(filename, strict=strict, revise_keys=list(revise_keys))

    def resume(self, checkpoint, resume_optimizer=True, map_location='default'):
        """MMCV's ``runner.resume``: continue exactly from ``checkpoint`` (model, optimizer(s),
        counters, hooks, RNG); ``resume_optimizer=False`` is refused (use load_checkpoint)."""
        if not resume_optimizer:
            raise ConfigError('resume(resume_optimizer=False) is not supported: hookloop resumes exactly; '
                              'use load_checkpoint(path) to start from the weights only')
        result = super().resume(checkpoint)
        # MMCV's runner.meta takes the checkpoint's meta at once (hook_msgs: the best checkpoint...);
        # the rest of the state is restored when the run starts (or now, during a run)
        if isinstance(result, dict):
            saved = result
        else:  # a sharded checkpoint's meta comes with its restore
            saved = load_checkpoint(checkpoint, map_location='cpu') if storage.isfile(checkpoint) else {}
        if self.meta is None:
            self.meta = self.runner_meta = {}
        self.meta.update(saved.get('meta', {}))
        return result

    def hook_messages(self):
        """``meta['hook_msgs']``, where MMCV's hooks record the last and best checkpoints; a
        runner without ``meta`` gets one, with MMCV's warning (its EvalHook makes it so)."""
        if self.meta is None:
            warnings.warn('runner.meta is None. Creating an empty one.')
            self.meta = self.runner_meta = {}
        return self.meta.setdefault('hook_msgs', {})

    # -- hooks -------------------------------------------------------------------------------
    def resolve_hooks(self):
        """The trainer's; in an iteration-based run, the hooks written for MMCV get the stages
        MMCV's IterBasedRunner calls (:mod:`hookloop.compat.mmcv.iter_stages`)."""
        rebuilt = self._dispatch is None
        table = super().resolve_hooks()
        if rebuilt and self.iter_based_runner:
            apply_iter_runner_stages(self._dispatch, self.hooks)
        return table

    def call_hook(self, fn_name, *args):
        """Call ``fn_name`` on the hooks: a stage through the trainer's dispatch, any other
        method name (MMCV's ``call_hook('before_epoch')``) on every hook that has it, in order."""
        if self._dispatch is not None and fn_name not in self._dispatch:
            for hook in self.hooks:
                method = getattr(hook, fn_name, None)
                if callable(method):
                    method(self, *args)
            return
        super().call_hook(fn_name, *args)


__all__ = ['MMCVTrainer', 'LATEST_LINK', 'link_latest']
