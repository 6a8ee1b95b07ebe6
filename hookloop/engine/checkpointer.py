"""The Checkpointer: what a checkpoint holds, how it is written, and how a run continues from one.

The trainer owns one (``trainer.checkpointer``); its public checkpoint methods
(``save_checkpoint``, ``build_checkpoint``, ``state_dict``, ``write_checkpoint``,
``wait_for_checkpoint``, ``resume``, ``load_weights``) delegate here. The checkpointer calls
back the trainer's ``state_dict`` / ``build_checkpoint`` / ``write_checkpoint``, so a trainer
subclass that extends one of them (MMCV's runner adds its ``meta``) is used by every save.
"""
import math
import time
from collections.abc import Mapping

import torch

from .. import __version__
from ..checkpoint.async_writer import AsyncCheckpointWriter
from ..checkpoint.finite_state import check_finite_state
from ..checkpoint.format import load_checkpoint
from ..checkpoint.format import write_checkpoint as write_checkpoint_file
from ..checkpoint.restore_checks import check_optimizer_fits, position_disagreement
from ..checkpoint.resume_position import is_count, refuse
from ..checkpoint.resume_changes import apply_optimizer_changes, plain
from ..checkpoint.resume_search import find_resumable, load_verified
from ..checkpoint.rng import get_rng_state, set_rng_state
from ..checkpoint.sharded_files import is_sharded_checkpoint
from ..checkpoint.trained_state import frozen_meta, load_trained_state, trained_state_dict
from ..dist.fsdp import is_sharded_model, load_sharded, save_sharded, verify_sharded
from ..dist.verdict import every_rank_agrees
from ..errors import CheckpointError
from ..fileio import storage
from ..optim.param_groups import set_value  # the param groups' one writer (a resume's config changes)
from . import elastic_resume, resume_request
from .builder import build_optimizer
from .preflight import hook_output_dirs
from .resume_report import resume_changes, run_settings
from .run_lineage import RunLineage
from .runner_names import model_meta, revise_state_keys
from .weight_gate import WeightGate


class Checkpointer(WeightGate):
    """Builds, writes and restores the trainer's checkpoints.

    ``optimizer_cfg``: the optimizer's config dict (None when the user built the optimizer), from
    which a resume with another optimizer config rebuilds the fresh param groups.
    ``async_writer``: the background writer of asynchronous saves, made on first use (None before).
    The weights gate's entry points (``export_file``, ``export_directory``, the run's ``baseline``)
    come from :class:`~hookloop.engine.weight_gate.WeightGate`.
    """

    def __init__(self, trainer, optimizer_cfg=None):
        super().__init__(trainer)
        self._optimizer_cfg = optimizer_cfg
        self.async_writer = None
        self.lineage = RunLineage()  # this run in its lineage of resumes: meta['run'], checkpoint names
        self.resume_command = None  # set by a launcher (the CLI) for resume_hint()

    # -- building and writing ---------------------------------------------------------------
    def state_dict(self, save_optimizer=True, save_frozen=True):
        """Everything exact resume needs, as tensors and plain containers. With
        ``save_frozen=False`` the weights are only the trained ones (``hookloop.checkpoint.trained_state``)."""
        t = self._trainer
        trained = self.trained_state(save_optimizer)
        checkpoint = {
            'meta': {**t.position.state_dict(), 'seed': t.seed,
                     **elastic_resume.position_meta(t, t.position.resume_point()[2]),
                     'hookloop_version': __version__, 'torch_version': str(torch.__version__),
                     'world_size': t.world_size, 'iters_per_epoch': t.iters_per_epoch, 'run': self.lineage.meta(),
                     'time': time.strftime('%Y-%m-%d %H:%M:%S'),
                     'config': plain(t.cfg) if t.cfg is not None else None, 'settings': run_settings(t),
                     **plain(model_meta(t.model))},
            'state_dict': trained['state_dict'],
            'hooks': trained['hooks'],
            'rng': get_rng_state(),
        }
        if t.train_dataloader is not None:  # the data position, taken with the weights
            checkpoint['data'] = t.train_stream.state_dict()
        if 'optimizer' in trained:
            checkpoint['optimizer'] = trained['optimizer']
        if not save_frozen:
            checkpoint['state_dict'] = trained_state_dict(t.model)
            checkpoint['meta']['frozen'] = frozen_meta(t.model)
        return checkpoint

    def build(self, save_optimizer=True, save_frozen=True):
        """The checkpoint dict: ``trainer.state_dict()`` plus the entries hooks add in
        ``before_save_checkpoint`` (EMA's ``ema_state_dict``). No collective: rank 0 may build
        and write one alone (docs/distributed.md). ``save_frozen=False``: only the trained weights."""
        t = self._trainer
        checkpoint = t.state_dict(save_optimizer, save_frozen)
        t.resolve_hooks()
        t.call_hook('before_save_checkpoint', checkpoint)
        return checkpoint

    def write(self, checkpoint, path, update_last=True, asynchronous=False, on_disk=None):
        """Write ``checkpoint`` (from :meth:`build`) atomically to ``path`` (absolute,
        or relative to the work dir; a local path or an fsspec URL); with ``update_last`` move
        the ``last_checkpoint`` pointer.

        ``asynchronous=True`` copies the state to CPU memory and writes it on a background
        thread (``hookloop/checkpoint/async_writer.py``); a write always waits for the one in flight
        first, so the staging copy is free and the pointer moves in save order.

        A state that is not finite (beyond the run's baseline) is refused first
        (``hookloop/checkpoint/finite_state.py``): nothing is written. The check is this rank's own,
        except in a sharded save, which every rank makes: there the ranks agree (``dist/verdict.py``).
        ``on_disk()`` (retention, replacing the best) runs once the file is on disk: at once for a
        synchronous save, at the next wait for an asynchronous one, never when the write failed."""
        t = self._trainer
        path = t.workspace.join(path)
        self.lineage.wrote(path)
        sharded = is_sharded_model(t.wrapped_model)
        check_finite_state(checkpoint, path, scaled_grads=t.step.loss_scaling, baseline=self.take_baseline(),
                           agree=every_rank_agrees if sharded else None)
        self.wait()
        if asynchronous and self.async_writer is None:
            self.async_writer = AsyncCheckpointWriter()
        if sharded:  # every rank writes its shards (dcp.async_save if asked)
            save_sharded(checkpoint, path, t.model, t.optimizer, t.rank,
                         t.storage_dir if update_last else None, self.async_writer if asynchronous else None)
            if asynchronous:
                self.async_writer.defer(on_disk)
                return path
        elif t.rank == 0:
            t.workspace.check_lock()  # the lock file deleted or replaced: another run may own the dir now
            storage.makedirs(storage.dirname(path))
            pointer_dir = t.storage_dir if update_last else None
            if asynchronous:
                writer = self.async_writer
                writer.submit(write_checkpoint_file, writer.stage(checkpoint), path, pointer_dir, on_disk=on_disk)
                return path
            write_checkpoint_file(checkpoint, path, pointer_dir)
        if on_disk is not None:
            on_disk()
        return path

    def save(self, path, save_optimizer=True, update_last=True, asynchronous=False, on_disk=None):
        """Build and write a checkpoint; returns its path (see :meth:`write`)."""
        t = self._trainer
        self.wait()  # hooks' state must not change under a write in flight
        return t.write_checkpoint(t.build_checkpoint(save_optimizer), path, update_last, asynchronous, on_disk)

    def wait(self):
        """Wait until a background checkpoint write (``async_save``) is on disk; a
        CheckpointError if it failed."""
        if self.async_writer is not None:
            self.async_writer.wait()

    def unclaimed(self, path):
        """The path a new checkpoint meant for ``path`` (absolute, or relative to the work dir)
        takes: ``path``, or ``<stem>.run<N><ext>`` when an earlier run wrote a file there (a run
        never overwrites an older run's checkpoint; ``hookloop/engine/run_lineage.py``)."""
        t = self._trainer
        return self.lineage.unclaimed(t.workspace.join(path), t.rank, t.world_size)

    def checkpoint_dirs(self):
        """Directories other than the work dir where this run's hooks save checkpoints (the
        ``'checkpoint'`` entries of their ``output_dirs``): a resume searches them, the run
        summary reads the last checkpoint's pointer there."""
        t = self._trainer
        dirs = []
        for hook in t.hooks:
            path = hook_output_dirs(t, hook).get('checkpoint')
            if path is not None and path != t.storage_dir and path not in dirs:
                dirs.append(path)
        return dirs

    # -- resuming ---------------------------------------------------------------------------
    def resume_target(self):
        """``(path, checkpoint)`` this run continues from, or ``(None, None)`` for a new run.

        ``resume_from=PATH``: that checkpoint, verified (a damaged one is one clear error).
        ``'auto'``: the newest checkpoint of the work dir that loads and verifies; damaged
        ones are skipped (logged) and renamed aside (``<name>.damaged``). Only the first ``train()``
        of a trainer (or one after :meth:`resume`) resumes: a later one continues from where it stopped."""
        t = self._trainer
        if t._started and not t._resume_again:
            return None, None
        path = t.resume_from
        if path is None and not t.auto_resume:
            path = resume_request.asked_by_hooks(t)
        if path == 'auto' or (path is None and t.auto_resume):
            found = find_resumable(t.storage_dir, self.checkpoint_dirs(), t.iters_per_epoch, t.logger,
                                   map_location=t.device, rename_damaged=t.rank == 0, verify_sharded=verify_sharded)
            if found is None:
                t.logger.info('no checkpoint in %s: starting a new run', t.storage_dir)
                return None, None
            return found
        if path is None:
            return None, None
        return path, check_resumable(path, load_verified(path, map_location=t.device, verify_sharded=verify_sharded))

    def plan_resume(self):
        """``(path, checkpoint, point)``: :meth:`resume_target` and where in it the run continues
        (:func:`hookloop.engine.elastic_resume.plan`, which refuses a change the data cannot
        follow); the run takes the checkpoint's seed. ``(None, None, None)`` for a new run."""
        t = self._trainer
        path, checkpoint = self.resume_target()
        self.lineage.start()
        if checkpoint is None:
            return path, None, None
        point = elastic_resume.plan(t, checkpoint['meta'], path)
        resume_request.adopt_seed(t, checkpoint['meta'])
        return path, checkpoint, point

    def restore_finished(self, path, checkpoint, point):
        """Restore a checkpoint that already ends the planned run (``point`` from
        :meth:`plan_resume`), so the trainer holds the finished state (model, EMA, ...), and say
        so; nothing runs, nothing is written. Releases the work dir's lock."""
        t = self._trainer
        try:
            t._setup_hooks()
            self.restore(path, checkpoint)
        finally:
            t.workspace.release()
        epochs_done = math.ceil(point.iter / t.iters_per_epoch)  # the last one may end mid-loader
        t.logger.info('already complete at epoch %d / iteration %d (max_%s=%d): nothing to do',
                      epochs_done, point.iter, 'epochs' if t.by_epoch else 'iters',
                      t.max_epochs if t.by_epoch else t.max_iters)

    def resume(self, path):
        """Continue from the checkpoint at ``path``. Before ``train()`` (MMCV's
        ``runner.resume(path)`` then ``run()``) the state is restored when the run starts,
        after ``setup`` and before ``before_run``, so what hooks build in ``setup`` (EMA
        averages) gets its saved state back. During a run it is restored at once (kept for old
        code; a hook asks for a resume with a ``resume_from`` attribute instead, docs/hooks.md)."""
        t = self._trainer
        if not (storage.isfile(path) or is_sharded_checkpoint(path)):
            raise CheckpointError(f'checkpoint {path!r} does not exist or is not a file')
        if t._running:
            return self.restore(path)
        t.resume_from, t.load_from, t._resume_again = path, None, True
        return None

    def restore(self, path, checkpoint=None):
        """Restore model, optimizer, counters, hook states and RNG from a checkpoint
        (``checkpoint``: its dict, when the caller has loaded and verified it already);
        then ``after_load_checkpoint``. Returns the checkpoint dict."""
        t = self._trainer
        if is_sharded_checkpoint(path):  # FSDP: model and optimizer shards load in place
            hook_states = {hook.name: hook.state_dict() for hook in t.hooks if hasattr(hook, 'state_dict')}
            checkpoint = load_sharded(path, t.model, t.optimizer, hook_states)
        else:
            if checkpoint is None:
                checkpoint = load_verified(path, map_location=t.device)
            check_resumable(path, checkpoint)
            point = elastic_resume.plan(t, checkpoint['meta'], path)  # may refuse, before anything is loaded
            try:
                frozen = checkpoint['meta'].get('frozen')
                if frozen is not None and not frozen.get('saved', True):
                    load_trained_state(t.model, checkpoint['state_dict'], frozen, path)
                else:
                    t.model.load_state_dict(checkpoint['state_dict'])
                if 'optimizer' in checkpoint and t.optimizer is not None:
                    check_optimizer_fits(t.optimizer, checkpoint['optimizer'], path)
                    t.optimizer.load_state_dict(checkpoint['optimizer'])
            except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
                detail = ' '.join(line.strip() for line in str(exc).strip().splitlines()[:2])
                raise CheckpointError(f'{path!r} does not fit this model/optimizer: {detail}') from None
        meta = checkpoint['meta']
        swapped = position_disagreement(path, meta)
        if swapped:
            t.logger.warning('%s', swapped)
        if is_sharded_checkpoint(path):
            point = elastic_resume.plan(t, meta, path)
        changes = self.config_changes(meta, point.iter, path)
        if changes and t.optimizer is not None:
            for line in apply_optimizer_changes(t.optimizer, changes, self.fresh_param_groups, set_value):
                t.logger.warning('%s', line)
        if meta.get('world_size', t.world_size) != t.world_size and not point.note:
            t.logger.warning('%s was saved with world_size %s, now %s: the data order after resume differs '
                             'from the original run', path, meta['world_size'], t.world_size)
        t.position.load_state_dict(meta)
        elastic_resume.apply(t, point)
        self.lineage.resumed_from(meta)
        if point.note:
            t.logger.warning('%s', point.note)
        resume_request.adopt_seed(t, meta)
        if t.train_dataloader is not None:
            t.train_stream.seed = t.seed
            data = checkpoint.get('data')
            if point.note and point.inner_iter == 0 and t.train_stream.per_epoch:
                data = None  # an epoch started afresh in another shape: the saved loader state is not needed
            t.train_stream.load_state_dict(data, t.epoch, t.inner_iter, path)
            elastic_resume.apply(t, point)  # the sampler's split, once the stream is at the epoch
        saved_states = checkpoint.get('hooks', {})
        for hook in t.hooks:
            if hook.name in saved_states and hasattr(hook, 'load_state_dict'):
                hook.load_state_dict(saved_states[hook.name])
        if 'rng' in checkpoint:
            try:
                set_rng_state(checkpoint['rng'])
            except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
                raise CheckpointError(f'{path!r} is damaged: its "rng" entry cannot be restored '
                                      f'({type(exc).__name__}: {exc})') from None
        else:
            t.logger.warning('%s has no "rng" entry (random generator states): the resumed run continues with '
                             'fresh random numbers, so it will not repeat an uninterrupted run exactly', path)
        t.resumed_from = storage.normalize(path)
        t.call_hook('after_load_checkpoint', checkpoint)
        t.replan()  # a resume during an epoch moves every schedule
        t.logger.info('resumed from %s at epoch %d, iteration %d (inner %d)', path, t.epoch, t.iter, t.inner_iter)
        return checkpoint

    def fresh_param_groups(self):
        """The param groups a fresh run builds from the optimizer config (None: built by the user)."""
        if self._optimizer_cfg is None:
            return None
        return build_optimizer(self._optimizer_cfg, self._trainer.model).param_groups

    def config_changes(self, meta, iteration, path='the checkpoint'):
        """How this run's settings and config differ from the checkpoint's (``meta``), logged in
        one block with what is kept (:func:`hookloop.engine.resume_report.resume_changes`)."""
        return resume_changes(self._trainer, meta, iteration, path)

    def resume_hint(self):
        """How to continue this run from its latest checkpoint: ``resume_command`` when the
        launcher set one (the CLI's ``hookloop train ... --resume auto``), else the Python form."""
        return self.resume_command or ("trainer.train() again, or Trainer(..., resume_from='auto') with work_dir="
                                       f'{self._trainer.storage_dir!r} in a new process')

    def load_weights(self, path, strict=True, revise_keys=None):
        """Initialise the model from a checkpoint's weights only (a fresh schedule).
        ``revise_keys=[(regex, replacement), ...]`` renames the saved keys first (MMCV's
        ``load_checkpoint``, e.g. ``[(r'^module\\.', '')]``); default: the trainer's ``revise_keys``."""
        t = self._trainer
        checkpoint = load_checkpoint(path, map_location=t.device)
        state = revise_state_keys(checkpoint.get('state_dict', checkpoint),
                                  t.revise_keys if revise_keys is None else revise_keys)
        frozen = checkpoint.get('meta', {}).get('frozen') if isinstance(checkpoint.get('meta'), dict) else None
        if frozen is not None and not frozen.get('saved', True):  # saved with save_frozen=False
            load_trained_state(t.model, state, frozen, path)
            t.logger.info('loaded the trained weights from %s', path)
            return checkpoint
        try:
            t.model.load_state_dict(state, strict=strict)
        except RuntimeError as exc:
            raise CheckpointError(f'weights in {path!r} do not fit the model: {str(exc).splitlines()[0]}') from None
        t.logger.info('loaded weights from %s', path)
        return checkpoint


def check_resumable(path, checkpoint):
    """``checkpoint`` if it has what a resume reads, else a CheckpointError naming ``path``."""
    sharded = is_sharded_checkpoint(path)
    for key in ('meta',) if sharded else ('meta', 'state_dict'):
        if key not in checkpoint:
            raise CheckpointError(f'{path!r} is not a hookloop checkpoint: it has no {key!r} entry')
    meta = checkpoint['meta']
    if not isinstance(meta, Mapping):
        raise CheckpointError(f'{path!r} is damaged: its "meta" entry is not a dict')
    for field in ('epoch', 'iter', 'inner_iter'):
        if not is_count(meta.get(field)):
            refuse(path, field, meta.get(field), 'not a whole number')
    return checkpoint


__all__ = ['Checkpointer', 'check_resumable', 'plain']
