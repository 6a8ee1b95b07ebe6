"""Checks that need the whole trainer (hooks and loaders together), run by ``train()``
before the work dir, its lock or any log file is created: a config error writes nothing.
What it asks the hooks is their contract (docs/hooks.md): ``EvaluationHook.evaluation_loader``
and ``Hook.output_dirs``, never their attributes.

A hook's output directory stays under the work dir unless the user named an absolute path:
such a directory is logged and handed to the work dir (``WorkDir.lock_outside``), which creates
and locks it with the work dir when the run starts; a relative one that ``..`` (or a symlink)
takes out of the work dir is refused."""
import os

from ..fileio import storage
from ..errors import ConfigError
from ..hooks.evaluation import EvaluationHook
from ..hooks.order import role_of
from ..fileio.paths import check_can_create_dir


def check_before_run(trainer):
    outside = []
    for hook in trainer.hooks:
        if role_of(hook) == 'evaluation':
            loader = hook.evaluation_loader(trainer) if isinstance(hook, EvaluationHook) else trainer.val_dataloader
            if loader is None:
                raise ConfigError(f'{hook.name} evaluates, but the trainer has no val_dataloader: give one, or '
                                  'remove the evaluation config')
        for kind, path in hook_output_dirs(trainer, hook).items():
            if storage.is_url(path):  # checkpoints live under the storage dir, which may be a URL
                storage.filesystem(path)  # an unknown protocol or a missing package: one line
            else:
                check_can_create_dir(path, f'{hook.name}: {kind} directory')
            if not _inside_work_dir(trainer, path, f'{hook.name}: its {kind} directory'):
                outside.append((hook.name, kind, path))
    if trainer.rank == 0:
        for name, kind, path in outside:
            trainer.logger.info('%s writes its %s outside the work dir, to %s (locked for this run as the work dir '
                                'is)', name, kind, path)
    trainer.workspace.lock_outside([path for _, _, path in outside])


def _inside_work_dir(trainer, path, what):
    """True for ``path`` under the work dir (or the storage dir); False for a place the user named
    outside it (an absolute ``out_dir``). A relative ``out_dir`` that ``..`` or a symlink takes
    out of the work dir (the path starts with the work dir, its real path does not) is refused."""
    path = os.fspath(path)
    roots = {trainer.work_dir, trainer.storage_dir}
    if storage.is_url(path):
        return any(storage.is_url(root) and (path.rstrip('/') + '/').startswith(root.rstrip('/') + '/')
                   for root in roots)  # a URL's "..": refused by the storage layer
    real = os.path.realpath(path)
    local_roots = [root for root in roots if not storage.is_url(root)]
    if any(real == os.path.realpath(root) or real.startswith(os.path.realpath(root) + os.sep)
           for root in local_roots):
        return True
    for root in local_roots:
        if path.startswith(root.rstrip(os.sep) + os.sep):
            raise ConfigError(f'{what} {path!r} leaves the work dir {root!r} (through ".." or a symbolic link): '
                              'a relative out_dir stays inside the work dir; give an absolute path to write '
                              'elsewhere')
    return False


def hook_output_dirs(trainer, hook):
    """``hook.output_dirs(trainer)``; a hook not derived from :class:`~hookloop.Hook` (MMCV-style
    duck-typed hooks) has none."""
    method = getattr(hook, 'output_dirs', None)
    return dict(method(trainer) or {}) if method is not None else {}
