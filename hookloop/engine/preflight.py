"""Checks that need the whole trainer (hooks and loaders together), run by ``train()``
before the work dir, its lock or any log file is created: a config error writes nothing."""
import os

from ..fileio import storage
from ..errors import ConfigError
from ..hooks.order import role_of
from ..fileio.paths import check_can_create_dir


def check_before_run(trainer):
    for hook in trainer.hooks:
        # (MMCV's EvalHook brings its own dataloader)
        if role_of(hook) == 'evaluation' and trainer.val_dataloader is None and \
                getattr(hook, 'dataloader', None) is None:
            raise ConfigError(f'{hook.name} evaluates, but the trainer has no val_dataloader: give one, or '
                              'remove the evaluation config')
        out_dir = getattr(hook, 'out_dir', None)
        if isinstance(out_dir, (str, os.PathLike)):
            what = f'{hook.name}: log directory' if role_of(hook) == 'logger' else f'{hook.name} out_dir'
            # A checkpoint hook's out_dir is under the storage dir (maybe a URL); a logger's
            # under the local work dir.
            base = trainer.storage_dir if role_of(hook) == 'checkpoint' else trainer.work_dir
            path = storage.join(base, os.fspath(out_dir))
            if storage.is_url(path):
                storage.filesystem(path)  # an unknown protocol or a missing package: one line
            else:
                check_can_create_dir(path, what)
