"""``TrainingArgs``: the command-line arguments of ModelScope's training examples.

An example subclasses it as a dataclass with fields of its own, builds it, reads the command
line and turns it into configuration overrides::

    @dataclass(init=False)
    class DreamboothArguments(TrainingArgs):
        instance_prompt: str = field(default='a photo of sks dog', metadata={'help': '...'})

    training_args = DreamboothArguments(task='text-to-image-synthesis').parse_cli()
    config, args = training_args.to_config()   # then cfg.merge_from_dict(config) in cfg_modify_fn

``--NAME VALUE`` sets a field (``true`` / ``false`` for booleans); a dotted ``--a.b.c VALUE``
(``--train.optimizer.lr 5e-6``) is a configuration override whose VALUE reads as an int, a float,
``true`` / ``false``, ``None``, or else a string. Fields with a configuration key (the
``cfg_node`` of their metadata: ``max_epochs`` -> ``train.max_epochs``, ``logging_interval`` ->
``train.logging.interval``, ``save_ckpt_strategy`` -> ``train.checkpoint.period.save_strategy``,
...) go into the configuration when they are given (in the constructor or on the command line);
``to_config()`` returns ``(configuration overrides, the arguments)``.
"""
import argparse
import dataclasses
import sys
import typing
from dataclasses import dataclass, field

from ..errors import ConfigError
from .modelscope_config import ModelScopeConfig


def _node(key, help_text, default=None):
    return field(default=default, metadata={'cfg_node': key, 'help': help_text})


@dataclass(init=False)
class TrainingArgs:
    """The arguments ModelScope's examples share (subclass it for more)."""

    task: str = _node('task', 'the task of the configuration')
    model: str = field(default=None, metadata={'help': 'the model: a local model directory'})
    model_revision: str = field(default=None, metadata={'help': 'the hub revision (unused for a local directory)'})
    seed: int = field(default=42, metadata={'help': 'the random seed'})
    work_dir: str = _node('train.work_dir', 'where checkpoints, logs and output/ go', './work_dir')
    train_dataset_name: str = field(default=None, metadata={'help': 'the train dataset: a local directory'})
    val_dataset_name: str = field(default=None, metadata={'help': 'the evaluation dataset: a local directory'})
    max_epochs: int = _node('train.max_epochs', 'the epochs to train')
    per_device_train_batch_size: int = _node('train.dataloader.batch_size_per_gpu', 'the train batch size per GPU')
    train_data_worker: int = _node('train.dataloader.workers_per_gpu', 'train data loader workers per GPU')
    per_device_eval_batch_size: int = _node('evaluation.dataloader.batch_size_per_gpu', 'the eval batch size per GPU')
    eval_data_worker: int = _node('evaluation.dataloader.workers_per_gpu', 'eval data loader workers per GPU')
    optimizer: str = _node('train.optimizer.type', 'the optimizer type (a torch.optim class name)')
    lr: float = _node('train.optimizer.lr', 'the learning rate')
    lr_scheduler: str = _node('train.lr_scheduler.type', 'the LR scheduler type (a torch scheduler class name)')
    save_ckpt_strategy: str = _node('train.checkpoint.period.save_strategy', "'by_epoch', 'by_step' or 'no'")
    logging_interval: int = _node('train.logging.interval', 'log every N iterations')
    eval_interval: int = _node('evaluation.period.interval', 'evaluate every N epochs')
    eval_metrics: str = _node('evaluation.metrics', 'the metric names')
    use_model_config: bool = field(default=False, metadata={
        'help': "merge these arguments into the model's configuration.json (else they are the whole configuration)"})
    local_rank: int = field(default=0, metadata={'help': 'set by the launcher'})

    def __init__(self, **kwargs):
        names = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ConfigError(f'{type(self).__name__} got unknown arguments {unknown}; its fields: {sorted(names)}')
        for name, spec in names.items():
            default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
            setattr(self, name, None if default is dataclasses.MISSING else default)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._given = set(kwargs)
        self._overrides = {}

    def parse_cli(self, parser_args=None):
        """Read ``--NAME VALUE`` for the fields and ``--a.b.c VALUE`` overrides from ``parser_args``
        (default: the command line); returns ``self``."""
        argv = list(sys.argv[1:] if parser_args is None else parser_args)
        hints = typing.get_type_hints(type(self))
        parser = argparse.ArgumentParser(prog=type(self).__name__, allow_abbrev=False)
        for spec in dataclasses.fields(self):
            kind = hints.get(spec.name, str)
            parser.add_argument(f'--{spec.name}', dest=spec.name, default=argparse.SUPPRESS,
                                type=_to_bool if kind is bool else kind, help=spec.metadata.get('help', ''))
        known, rest = parser.parse_known_args(argv)
        for name, value in vars(known).items():
            setattr(self, name, value)
            self._given.add(name)
        self._overrides.update(_dotted_overrides(rest))
        return self

    def to_config(self, ignore_default_config=None):
        """``(configuration overrides, self)``: the ``cfg_node`` of every field given, and the
        dotted overrides of the command line."""
        overrides = {}
        for spec in dataclasses.fields(self):
            key = spec.metadata.get('cfg_node')
            if key and spec.name in self._given and getattr(self, spec.name) is not None:
                overrides[key] = getattr(self, spec.name)
        overrides.update(self._overrides)
        config = ModelScopeConfig()
        config.merge_from_dict(overrides)
        return config, self


def _to_bool(text):
    lowered = str(text).lower()
    if lowered in ('true', '1', 'yes'):
        return True
    if lowered in ('false', '0', 'no'):
        return False
    raise argparse.ArgumentTypeError(f'expected true or false, got {text!r}')


def _literal(text):
    """ModelScope's reading of a command-line value: int, float, true/false, None, else the string."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.lower() in ('true', 'false'):
        return text.lower() == 'true'
    return None if text == 'None' else text


def _dotted_overrides(rest):
    overrides, index = {}, 0
    while index < len(rest):
        token = rest[index]
        if not token.startswith('--') or '.' not in token.split('=', 1)[0]:
            raise ConfigError(f'TrainingArgs: unknown command-line argument {token!r} (fields are --NAME VALUE, '
                              'configuration overrides --a.b.c VALUE)')
        if '=' in token:
            key, value = token[2:].split('=', 1)
            index += 1
        else:
            if index + 1 >= len(rest):
                raise ConfigError(f'TrainingArgs: {token} needs a value')
            key, value = token[2:], rest[index + 1]
            index += 2
        overrides[key] = _literal(value)
    return overrides


__all__ = ['TrainingArgs']
