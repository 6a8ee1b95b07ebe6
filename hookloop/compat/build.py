"""Trainers from configs: :func:`build_trainer` translates other engines' configs (ModelScope's
``configuration.json``, MMCV 1.x keys) into the Trainer's arguments, then builds it.

Translation happens here, before a trainer exists: ``Trainer(...)`` takes hookloop's arguments
only. It lives in ``compat/`` because it uses the translators; the engine never imports it.
"""
from ..engine.runner_names import MMCV_KEYS
from ..engine.trainer import Trainer
from ..errors import ConfigError
from ..registry import TRAINERS, closest_names
from . import modelscope
from .mmcv.trainer import MMCVTrainer
from .mmcv_config import is_mmcv_config, is_mmcv_run, trainer_arguments, translate


def build_trainer(name='default', default_args=None):
    """Build a registered trainer: ``build_trainer(name='default', default_args=dict(...))``.

    For the Trainer (and its subclasses) other engines' configs are translated first: a
    ModelScope ``configuration.json`` (or ``default_args=dict(cfg_file=..., cfg_modify_fn=...)``,
    :mod:`hookloop.compat.modelscope`) and MMCV 1.x keys (``runner``, ``data``, ``workflow``,
    ``fp16``, ..., :mod:`hookloop.compat.mmcv_config`); helper names are listed in one info line
    at start, likely typos are errors. An MMCV 1.x config (one with ``runner``, ``data``,
    ``workflow``...) builds an :class:`~hookloop.compat.mmcv.trainer.MMCVTrainer`: the model in
    ``MMDataParallel`` and MMCV's runner methods, for the hooks its repository ships.
    """
    args = dict(default_args or {})
    target = TRAINERS.get(name) if isinstance(name, str) else name
    notes = []
    if getattr(target, 'takes_modelscope_arguments', False):
        pass  # ModelScope's own trainers ('dreambooth-diffusion', ...) read ModelScope's arguments themselves
    elif isinstance(target, type) and issubclass(target, Trainer):
        if getattr(target, 'strict_arguments', False):  # dreambooth_diffusion: no helper variables
            refuse_unknown_arguments(args, target, name if isinstance(name, str) else target.__name__)
        elif 'cfg_file' in args:  # ModelScope's build_trainer(default_args=dict(cfg_file=..., cfg_modify_fn=...))
            args = modelscope.trainer_args(args)
        elif modelscope.looks_like_modelscope(args) and not is_mmcv_config(args):  # a configuration.json
            # (an MMCV config's top-level ``train`` is a helper variable: mmocr's dataset dicts)
            args = modelscope.translate(args)
        elif target is Trainer and is_mmcv_run(args):  # an MMCV 1.x config: hooks get MMCV's runner API
            target = MMCVTrainer
        args, notes = translate(args, target)
    trainer = TRAINERS.build(dict(type=target, **args))
    for note in notes:
        trainer.logger.info(note)
    return trainer


def refuse_unknown_arguments(args, target, label):
    """A trainer that declares ``strict_arguments`` takes no helper variables: a name that is
    neither one of its arguments nor an MMCV config key is a ConfigError naming the closest ones."""
    known = trainer_arguments(target)
    unknown = [name for name in args if name not in known and name not in MMCV_KEYS]
    if not unknown:
        return
    lines = []
    for name in unknown:
        hint = closest_names(name, known)
        lines.append(f'{name!r}' + (f' (did you mean {", ".join(map(repr, hint))}?)' if hint else ''))
    raise ConfigError(f'{label} got unexpected argument{"s" if len(lines) > 1 else ""} {", ".join(lines)}; '
                      'its arguments are listed in docs/dreambooth.md')


__all__ = ['build_trainer']
