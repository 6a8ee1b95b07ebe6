"""WandbLoggerHook: metrics and config of a Weights & Biases run."""
import os

from ...registry import HOOKS
from .base import LoggerHook, flatten, require


@HOOKS.register_module()
class WandbLoggerHook(LoggerHook):
    """Logs every metric as ``<mode>/<key>`` with step = iterations completed, and the config
    as the run's config. ``WANDB_MODE=offline`` (or ``init_kwargs=dict(mode='offline')``)
    writes the run under ``<dir>/wandb/offline-run-*`` with no account and no network.

    Args:
        init_kwargs: passed to ``wandb.init`` (``project``, ``name``, ``mode``, ``dir``, ...);
            ``dir`` defaults to the work dir, ``config`` to the trainer's config.
        commit: accepted for MMCV configs. Rows are always sent with an explicit step and
            ``commit=False``: wandb commits a row when a later step arrives or at finish, so
            validation results of step N join training step N's row (wandb would drop
            values sent to an already committed step).
        log_artifact: at the end, upload the work dir's ``out_suffix`` files as an artifact.
        out_suffix: the suffixes of the files ``log_artifact`` takes.
        interval, ignore_last, by_epoch: see :class:`LoggerHook`.
    """

    def __init__(self, init_kwargs=None, commit=True, log_artifact=False, out_suffix=('.log.json', '.log'),
                 interval=10, ignore_last=True, by_epoch=True):
        super().__init__(interval, ignore_last, by_epoch)
        self.wandb = require('wandb', type(self).__name__)
        self.init_kwargs = dict(init_kwargs or {})
        self.commit, self.log_artifact = commit, log_artifact
        self.out_suffix = tuple([out_suffix] if isinstance(out_suffix, str) else out_suffix)
        self.run = None

    def open(self, trainer):
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault('dir', trainer.work_dir)
        if trainer.cfg is not None:
            kwargs.setdefault('config', flatten(trainer.cfg))
        self.run = self.wandb.init(**kwargs)

    def log(self, trainer, record):
        metrics = {f'{record["mode"]}/{k}': v for k, v in self.metrics_of(record).items()}
        # commit=False: the row of this step stays open for validation results at the same
        # step; wandb commits it when a later step arrives (or at finish).
        self.run.log(metrics, step=record['iter'], commit=False)

    def log_images(self, trainer, tag, images, step):
        self.run.log({tag: [self.wandb.Image(image) for image in images]}, step=step, commit=False)

    def close(self, trainer):
        try:
            if self.log_artifact and not trainer.outcome.failed:
                artifact = self.wandb.Artifact(name=f'{self.run.id}-logs', type='logs')
                for name in sorted(os.listdir(trainer.work_dir)):
                    if name.endswith(self.out_suffix):
                        artifact.add_file(os.path.join(trainer.work_dir, name))
                self.run.log_artifact(artifact)
        finally:
            self.run.finish(exit_code=1 if trainer.outcome.failed else 0)
