"""Checks that need the whole trainer (hooks and loaders together), run by ``train()``
before the work dir, its lock or any log file is created: a config error writes nothing.
What it asks the hooks is their contract (docs/hooks.md): ``EvaluationHook.evaluation_loader``
and ``Hook.output_dirs``, never their attributes."""
from ..fileio import storage
from ..errors import ConfigError
from ..hooks.evaluation import EvaluationHook
from ..hooks.order import role_of
from ..fileio.paths import check_can_create_dir


def check_before_run(trainer):
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


def hook_output_dirs(trainer, hook):
    """``hook.output_dirs(trainer)``; a hook not derived from :class:`~hookloop.Hook` (MMCV-style
    duck-typed hooks) has none."""
    method = getattr(hook, 'output_dirs', None)
    return dict(method(trainer) or {}) if method is not None else {}
