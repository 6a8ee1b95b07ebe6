"""CheckpointHook: saves checkpoints on an interval and keeps the newest few."""
import os

from ..errors import ConfigError
from ..priority import Priority
from ..registry import HOOKS
from .base import Hook


@HOOKS.register_module()
class CheckpointHook(Hook):
    """Saves ``epoch_{n}.pth`` / ``iter_{n}.pth`` (n = completed epochs / iterations).

    Args:
        interval: save every ``interval`` epochs (``by_epoch``) or iterations; -1 only at the end.
        by_epoch: count ``interval`` in epochs or iterations.
        save_optimizer: include the optimizer state (needed for exact resume).
        out_dir: where to save (default: the work dir).
        max_keep_ckpts: keep only this many of the newest interval checkpoints (-1 keeps all).
        save_last: also save after the last epoch / iteration.
    """

    PRIORITY = Priority.NORMAL
    ROLE = 'checkpoint'

    def __init__(self, interval=-1, by_epoch=True, save_optimizer=True, out_dir=None, max_keep_ckpts=-1,
                 save_last=True):
        if isinstance(interval, bool) or not isinstance(interval, int) or interval == 0 or interval < -1:
            raise ConfigError(f'CheckpointHook interval must be a positive int or -1, got {interval!r}')
        if isinstance(max_keep_ckpts, bool) or not isinstance(max_keep_ckpts, int) or \
                max_keep_ckpts == 0 or max_keep_ckpts < -1:
            raise ConfigError(f'CheckpointHook max_keep_ckpts must be a positive int or -1, got {max_keep_ckpts!r}')
        self.interval, self.by_epoch, self.save_optimizer = interval, by_epoch, save_optimizer
        self.out_dir, self.max_keep_ckpts, self.save_last = out_dir, max_keep_ckpts, save_last
        self.saved = []

    def after_train_epoch(self, trainer):
        if self.by_epoch and (self.every_n_epochs(trainer, self.interval) or
                              (self.save_last and self.is_last_epoch(trainer))):
            self._save(trainer, f'epoch_{trainer.epoch + 1}.pth')

    def after_train_iter(self, trainer):
        if not self.by_epoch and (self.every_n_iters(trainer, self.interval) or
                                  (self.save_last and self.is_last_iter(trainer))):
            self._save(trainer, f'iter_{trainer.iter + 1}.pth')

    def _save(self, trainer, filename):
        path = os.path.join(self.out_dir or trainer.work_dir, filename)
        if path in self.saved:
            return
        trainer.save_checkpoint(path, save_optimizer=self.save_optimizer)
        self.saved.append(path)
        trainer.logger.info('saved checkpoint %s', path)
        if self.max_keep_ckpts > 0 and trainer.rank == 0:
            while len(self.saved) > self.max_keep_ckpts:
                old = self.saved.pop(0)
                if os.path.exists(old):
                    os.remove(old)

    def state_dict(self):
        return {'saved': list(self.saved)}

    def load_state_dict(self, state):
        self.saved = list(state.get('saved', []))
