"""CheckpointHook: saves checkpoints on an interval, keeps the newest few and the best one."""
import os

from ..fileio import storage
from ..checkpoint.best import BestCheckpoint
from ..checkpoint.atomic import remove_stale_temporaries
from ..checkpoint.format import inside, read_pointer, remove_checkpoint, safetensors_bytes
from ..errors import CheckpointError, ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import NEVER, Hook


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


@HOOKS.register_module()
class CheckpointHook(Hook):
    """Saves ``epoch_{n}.pth`` / ``iter_{n}.pth`` (n = completed epochs / iterations) and
    moves ``<work_dir>/last_checkpoint`` to each.

    Args:
        interval: save every ``interval`` epochs (``by_epoch``) or iterations; -1: only the last.
        by_epoch: count ``interval`` in epochs (True) or iterations (False).
        save_optimizer: include the optimizer state (needed for exact resume).
        out_dir: where to save; relative paths are inside the work dir (default: the work dir).
            The ``last_checkpoint`` pointer stays in the work dir.
        max_keep_ckpts: keep only this many of the newest interval checkpoints (-1 keeps all).
            The latest checkpoint and the best one are never deleted. The checkpoint a run
            resumed from counts as one of them when it lies in this hook's directory; files
            outside this run's work dir and ``out_dir`` are never deleted.
        save_last: also save after the last epoch / iteration.
        save_best: a metric name in ``trainer.metrics`` (set by evaluation), or ``'auto'`` for
            the first metric. Each time a new evaluation improves it, the checkpoint at that
            point is kept as ``best_<metric>_epoch_{n}.pth`` / ``best_<metric>_iter_{n}.pth``
            (the previous best file is removed).
        rule: ``'greater'`` or ``'less'``: which way ``save_best`` improves. Inferred for
            common names (acc, top1, mAP, f1, ... -> greater; loss, error, mse, ... -> less).
        export_safetensors: also write the weights beside each checkpoint as ``.safetensors``:
            ``True``/``'model'`` the model's weights, ``'ema'`` the EMA weights (needs an EMAHook).
        async_save: copy the state to CPU memory at the save point and write it on a background
            thread while training goes on (same crash-safety; one save in flight; the run waits
            for it at the end; a failed write is raised at the next save or at the end).
            Old checkpoints are removed once the newer one is on disk.
        save_frozen: False saves only the trained weights (parameters with ``requires_grad``,
            the buffers of their modules and of modules in training mode) plus a fingerprint
            of the frozen rest; a resume
            takes the frozen rest from the model as built and refuses one whose frozen weights
            differ (``hookloop.checkpoint.trained_state``). Optimizer, schedule, RNG and hook states are
            saved as always.
    """

    PRIORITY = Priority.NORMAL
    ROLE = 'checkpoint'
    RUNS_AFTER = ('optimizer',)

    def __init__(self, interval=-1, by_epoch=True, save_optimizer=True, out_dir=None, max_keep_ckpts=-1,
                 save_last=True, save_best=None, rule=None, export_safetensors=False, async_save=False,
                 save_frozen=True):
        if not _is_int(interval) or interval == 0 or interval < -1:
            raise ConfigError(f'CheckpointHook interval must be a positive int or -1, got {interval!r}')
        if not _is_int(max_keep_ckpts) or max_keep_ckpts == 0 or max_keep_ckpts < -1:
            raise ConfigError(f'CheckpointHook max_keep_ckpts must be a positive int or -1, got {max_keep_ckpts!r}')
        if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
            raise ConfigError(f'CheckpointHook out_dir must be a path, got {out_dir!r}')
        self.best = BestCheckpoint('CheckpointHook', save_best, rule) if save_best is not None else None
        if export_safetensors not in (False, True, 'model', 'ema'):
            raise ConfigError("CheckpointHook export_safetensors must be False, True, 'model' or 'ema', "
                              f'got {export_safetensors!r}')
        self.interval, self.by_epoch, self.save_optimizer = interval, by_epoch, save_optimizer
        self.out_dir, self.max_keep_ckpts, self.save_last = out_dir, max_keep_ckpts, save_last
        if not isinstance(save_frozen, bool):
            raise ConfigError(f'CheckpointHook save_frozen must be True or False, got {save_frozen!r}')
        self.save_frozen = save_frozen
        self.export = {False: None, True: 'model'}.get(export_safetensors, export_safetensors)
        if not isinstance(async_save, bool):
            raise ConfigError(f'CheckpointHook async_save must be True or False, got {async_save!r}')
        self.async_save = async_save
        self.saved = []          # interval checkpoints (absolute paths or URLs), oldest first
        self._writing = None     # the interval checkpoint being saved: its own state lists it

    # -- stages ------------------------------------------------------------------------------
    def setup(self, trainer):
        # Known before any state is loaded (a resume restores after setup, before before_run).
        # Checkpoints live under the storage dir (the work dir, or its URL).
        self._work_dir = trainer.storage_dir
        self.directory = self.checkpoint_dir(trainer)
        if self.best is not None:
            self.best.bind(self.directory)

    def output_dirs(self, trainer):
        return {'checkpoint': self.checkpoint_dir(trainer)}

    def checkpoint_dir(self, trainer):
        """Where this hook saves: ``out_dir`` inside the storage dir (the work dir, or its URL)."""
        return storage.join(trainer.storage_dir, os.fspath(self.out_dir)) if self.out_dir else trainer.storage_dir

    def before_run(self, trainer):
        if trainer.rank == 0:
            storage.makedirs(self.directory)
            for path in remove_stale_temporaries(self.directory):
                trainer.logger.info('removed %s, left by a save that was interrupted', path)

    def after_train_epoch(self, trainer):
        name = f'epoch_{trainer.epoch + 1}.pth'
        self._track_best(trainer, name)
        if self.by_epoch and (self.every_n_epochs(trainer, self.interval) or
                              (self.save_last and self.is_last_epoch(trainer))):
            self._save(trainer, name)

    def next_call(self, trainer, stage, start):
        if stage != 'after_train_iter':
            return None  # a stage this schedule was not written for
        if self.best is not None:
            return None  # a validation may have run in any iteration
        if self.by_epoch:
            return NEVER
        due = self.next_every_n_iters(start, self.interval) if self.interval > 0 else NEVER
        last = trainer.max_iters - 1
        return min(due, last) if self.save_last and start <= last else due

    def after_train_iter(self, trainer):
        if self.by_epoch and self.best is None:  # the common case: nothing to do per iteration
            return
        name = f'iter_{trainer.iter + 1}.pth'
        self._track_best(trainer, name)
        if not self.by_epoch and (self.every_n_iters(trainer, self.interval) or
                                  (self.save_last and self.is_last_iter(trainer))):
            self._save(trainer, name)

    def after_load_checkpoint(self, trainer, checkpoint):
        # Retention counts the checkpoint the run continued from (a preempt or another
        # name), so max_keep_ckpts holds across any number of resumes.
        resumed = trainer.resumed_from
        directory = getattr(self, 'directory', None)
        if resumed and directory and self._owns(resumed) and resumed not in self.saved and \
                (self.best is None or resumed != self.best.path):
            self.saved.insert(0, resumed)

    def _owns(self, path):
        """True for a path this hook may delete: inside its directory or the work dir."""
        directories = [d for d in (getattr(self, 'directory', None), getattr(self, '_work_dir', None)) if d]
        return any(inside(path, d) for d in directories)

    # -- saving ----------------------------------------------------------------------------
    def _write(self, trainer, path, update_last, on_disk=None):
        # A save in flight must be on disk (its retention done) before hooks' states are taken.
        trainer.wait_for_checkpoint()
        # build_checkpoint returns the dict every hook has added its entries to
        # (``ema_state_dict``), which the safetensors export reads.
        checkpoint = trainer.build_checkpoint(save_optimizer=self.save_optimizer, save_frozen=self.save_frozen)
        trainer.write_checkpoint(checkpoint, path, update_last=update_last, asynchronous=self.async_save,
                                 on_disk=on_disk)
        if self.export is not None and trainer.rank == 0:
            key = 'state_dict' if self.export == 'model' else 'ema_state_dict'
            if key not in checkpoint:
                raise CheckpointError(f"CheckpointHook export_safetensors='ema': the checkpoint has no "
                                      f'{key!r}; register an EMAHook')
            state = checkpoint[key]  # through the gate, as every weights file (checkpoint/gate.py)
            trainer.checkpointer.export_file(os.path.splitext(path)[0] + '.safetensors',
                                             lambda f: f.write(safetensors_bytes(state)), state)

    def _save(self, trainer, filename):
        path = storage.join(self.directory, filename)
        if self.saved and path == self.saved[-1]:
            return  # saved at this position already
        if path in self.saved:  # an older file of that name: a resume re-based the iterations (another batch size)
            self.saved.remove(path)
        self._writing = path

        def on_disk():  # only once the new file is on disk may older ones go
            if path not in self.saved:
                self.saved.append(path)
            self._remove_old(trainer)
        try:
            self._write(trainer, path, update_last=True, on_disk=on_disk)
        finally:
            self._writing = None
        trainer.logger.info('saving checkpoint %s in the background' if self.async_save else 'saved checkpoint %s',
                            path)

    def _remove_old(self, trainer):
        if self.max_keep_ckpts < 0 or trainer.rank != 0:
            return
        try:
            latest = read_pointer(trainer.storage_dir, also_inside=[self.directory])
        except CheckpointError:
            latest = None
        best = self.best.path if self.best is not None else None
        protected = {storage.normalize(p) for p in (latest, best, self.saved[-1]) if p}
        while len(self.saved) > self.max_keep_ckpts:
            old = self.saved.pop(0)
            if storage.normalize(old) in protected or not self._owns(old):
                continue
            for victim in (old, os.path.splitext(old)[0] + '.safetensors'):
                if storage.exists(victim):
                    remove_checkpoint(victim)

    def _track_best(self, trainer, filename):
        if self.best is not None:
            self.best.update(trainer, self.directory, filename,
                             lambda path, on_disk: self._write(trainer, path, update_last=False, on_disk=on_disk))

    def run_summary(self, trainer):
        return self.best.run_summary(trainer) if self.best is not None else {}

    # -- state -------------------------------------------------------------------------------
    # Paths are stored relative to the work dir, so a copied or moved work dir deletes its
    # own files, never the original's; a path that resolves outside this run's directories
    # (an older checkpoint's absolute path, another run's file) is forgotten, not deleted.
    def _relative(self, path):
        base = getattr(self, '_work_dir', None)
        return storage.relpath(path, base) if base and self._owns(path) else path

    def _resolve(self, path):
        if not isinstance(path, str):
            return None
        path = storage.resolve(self._work_dir, path)
        return path if self._owns(path) else None

    def state_dict(self):
        # A checkpoint lists itself, so a run resumed from it counts it (and removes it in turn).
        saved = self.saved + [self._writing] if self._writing and self._writing not in self.saved else self.saved
        state = {'saved': [self._relative(p) for p in saved]}
        if self.best is not None:
            state.update(self.best.state_dict())
        return state

    def load_state_dict(self, state):
        self.saved = [p for p in map(self._resolve, state.get('saved', [])) if p is not None]
        if self.best is not None:
            self.best.load_state_dict(state)
