"""Trainers from configs: :func:`build_trainer` translates other engines' configs (ModelScope's
``configuration.json``, MMCV 1.x keys) into the Trainer's arguments, then builds it.

Translation happens here, before a trainer exists: ``Trainer(...)`` takes hookloop's arguments
only. It lives in ``compat/`` because it uses the translators; the engine never imports it.
"""
from ..engine.trainer import Trainer
from ..registry import TRAINERS
from . import modelscope
from .mmcv.trainer import MMCVTrainer
from .mmcv_config import is_mmcv_config, is_mmcv_run, translate


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
    if isinstance(target, type) and issubclass(target, Trainer):
        if 'cfg_file' in args:  # ModelScope's build_trainer(default_args=dict(cfg_file=..., cfg_modify_fn=...))
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


__all__ = ['build_trainer']
