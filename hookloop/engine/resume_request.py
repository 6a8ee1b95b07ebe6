"""Who asks for a resume, and which seed a resumed run continues with.

* A hook may name a checkpoint in a ``resume_from`` attribute (MMCV's
  ``EMAHook(resume_from=...)``): the trainer reads it before the hook's first run and resumes
  from it after ``setup`` and before ``before_run``, as for its own ``resume_from`` (which wins).
  Hooks never resume from inside a stage.
* A resumed run continues with the checkpoint's seed (the data order, the worker seeds and the
  RNG states belong to it); a different seed given to the trainer is warned about, not used.
"""
import os

from ..fileio import storage
from ..errors import CheckpointError, ConfigError
from ..checkpoint.sharded_files import is_sharded_checkpoint


def asked_by_hooks(trainer):
    """The checkpoint the hooks name in ``resume_from`` (None: none), at each hook's first run
    only; two hooks naming different checkpoints are a ConfigError."""
    asked = {}
    for hook in trainer.hooks:
        path = getattr(hook, 'resume_from', None)
        if isinstance(path, (str, os.PathLike)) and id(hook) not in trainer._set_up:
            asked.setdefault(os.fspath(path), hook.name)
    if len(asked) > 1:
        raise ConfigError(f'hooks name different checkpoints to resume from: {asked}')
    if not asked:
        return None
    (path, owner), = asked.items()
    if not (storage.isfile(path) or is_sharded_checkpoint(path)):
        raise CheckpointError(f'{owner} resume_from {path!r} does not exist or is not a file')
    return path


def adopt_seed(trainer, meta):
    """Take the checkpoint's seed (before the run logs its seed)."""
    saved = meta.get('seed')
    if not isinstance(saved, int) or isinstance(saved, bool) or saved == trainer.seed:
        return
    if trainer._seed_given:
        trainer.logger.warning("seed=%d is given but the checkpoint was trained with seed %d: the checkpoint's "
                               'seed is kept, so the data order and the RNG states continue', trainer.seed, saved)
    trainer.seed = saved
    if trainer.train_dataloader is not None:
        trainer.train_stream.seed = saved
