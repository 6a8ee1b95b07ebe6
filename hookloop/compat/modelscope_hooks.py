"""Hooks that write what ModelScope users and tools read back, for runs built from a
ModelScope configuration (the native API keeps hookloop's names):

* :class:`ModelScopeCheckpointHook` — hookloop's ``CheckpointHook`` (one crash-safe file per
  checkpoint) that names the best file as ModelScope does (``best_epoch1_accuracy0.1.pth``,
  ``best_iter20_loss0.5.pth``, or ``save_file_name``) and keeps ModelScope's inference folders
  up to date: ``<work_dir>/output/`` (after each interval checkpoint) and
  ``<work_dir>/output_best/`` (after each new best) hold ``configuration.json`` and the other
  files of the model's ``model_dir`` (written before training), ``pytorch_model.bin`` (the model's plain state dict, ``torch.save`` of
  tensors only: it loads with ``torch.load(weights_only=True)``) and ``eval_result.txt`` (the
  latest metrics, JSON).
* :class:`ModelScopeTextLoggerHook` — the JSON-lines log with ModelScope's keys:
  ``iter_time`` / ``data_load_time`` for ``time`` / ``data_time``, ``mode: 'eval'`` for
  validation records and, by epoch, ``iter`` counted within the epoch (the terminal line keeps
  hookloop's format).
* :class:`ModelScopeTensorboardHook` — event files in ``<work_dir>/tensorboard_output``,
  scalars tagged with the bare key (``loss``, ``lr``, ``accuracy``), timing keys left out.
"""
import io
import json
import os
import shutil
from collections import OrderedDict

import torch

from ..fileio import storage
from ..checkpoint.best import BestCheckpoint
from ..checkpoint.atomic import atomic_write
from ..errors import ConfigError
from ..dist.fsdp import is_sharded_model
from ..hooks.checkpoint import CheckpointHook
from ..hooks.loggers.tensorboard import TensorboardLoggerHook
from ..hooks.loggers.text import TextLoggerHook
from ..registry import HOOKS

RECORD_KEYS = {'time': 'iter_time', 'data_time': 'data_load_time'}
CONFIGURATION = 'configuration.json'
MODEL_FILE = 'pytorch_model.bin'
EVAL_RESULT_FILE = 'eval_result.txt'


def modelscope_record(record, iters_per_epoch=None):
    """A log record with ModelScope's names. With ``iters_per_epoch`` (a by-epoch log) ``iter``
    counts within the epoch, as ModelScope's text log does."""
    named = {RECORD_KEYS.get(k, k): v for k, v in record.items()}
    if named.get('mode') == 'val':
        named['mode'] = 'eval'
    if iters_per_epoch:
        inner = named.pop('inner_iter', None)
        named['iter'] = inner if inner is not None else named['iter'] - (named['epoch'] - 1) * iters_per_epoch
    return named


class ModelScopeBest(BestCheckpoint):
    """ModelScope's best file name: ``best_<epoch|iter><n>_<metric><value>.pth``."""

    def __init__(self, owner, save_best, rule=None, save_file_name=None):
        super().__init__(owner, save_best, rule)
        if save_file_name is not None and not (isinstance(save_file_name, str) and save_file_name
                                               and os.path.basename(save_file_name) == save_file_name):
            raise ConfigError(f'BestCkptSaverHook save_file_name must be a file name, got {save_file_name!r}')
        self.save_file_name = save_file_name

    def file_name(self, key, score, filename):
        if self.save_file_name is not None:
            return self.save_file_name if os.path.splitext(self.save_file_name)[1] else self.save_file_name + '.pth'
        unit, count = os.path.splitext(filename)[0].split('_')  # 'epoch_3.pth' -> epoch, 3
        return f'best_{unit}{count}_{key}{score}.pth'


def _state_dict_bytes(state):
    plain = OrderedDict((k, v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in state.items())
    metadata = getattr(state, '_metadata', None)
    if metadata is not None:
        plain._metadata = metadata
    buffer = io.BytesIO()
    torch.save(plain, buffer)
    return buffer.getvalue()


WEIGHT_SUFFIXES = ('.bin', '.pth', '.pt', '.safetensors', '.ckpt', '.h5', '.msgpack', '.onnx')


def copy_model_files(trainer, folder):
    """Copy what the model's directory holds besides its weights and its configuration (a
    tokenizer's vocabulary, a README, ...) into ``folder``, as ModelScope's checkpoint hook does
    for a model with a ``model_dir`` (ModelScope's ``Model`` API)."""
    source = getattr(trainer.model, 'model_dir', None)
    if not isinstance(source, (str, os.PathLike)) or not os.path.isdir(source) or storage.is_url(folder):
        return
    source = os.path.realpath(source)
    if os.path.realpath(folder).startswith(source + os.sep):
        return  # the output folder is inside the model directory: copying it into itself would not end
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if name.startswith('.') or name == CONFIGURATION or name.lower().endswith(WEIGHT_SUFFIXES):
            continue
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(folder, name), dirs_exist_ok=True,
                            ignore=lambda _, names: [n for n in names if n.lower().endswith(WEIGHT_SUFFIXES)])
        else:
            shutil.copy2(path, os.path.join(folder, name))


@HOOKS.register_module()
class ModelScopeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with ModelScope's best file name and ``output/`` folders.

    Args (beyond :class:`~hookloop.hooks.CheckpointHook`'s):
        output_dir: the inference folder of interval checkpoints (default ``output``; relative
            paths are inside the work dir).
        best_output_dir: the inference folder of the best checkpoint (default ``output_best``).
        save_file_name: a fixed name for the best checkpoint (ModelScope's ``save_file_name``).
        configuration: the ModelScope configuration written as ``configuration.json``.
    """

    def __init__(self, output_dir='output', best_output_dir='output_best', save_file_name=None, configuration=None,
                 best_dir=None, **kwargs):
        save_best, rule = kwargs.get('save_best'), kwargs.get('rule')
        super().__init__(**kwargs)
        if save_best is not None:
            self.best = ModelScopeBest('BestCkptSaverHook', save_best, rule, save_file_name)
        for name, value in (('output_dir', output_dir), ('best_output_dir', best_output_dir)):
            if not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f'ModelScope CheckpointHook {name} must be a path, got {value!r}')
        self.output_dir, self.best_output_dir = os.fspath(output_dir), os.fspath(best_output_dir)
        if best_dir is not None and not isinstance(best_dir, (str, os.PathLike)):
            raise ConfigError(f'ModelScope BestCkptSaverHook save_dir must be a path, got {best_dir!r}')
        self.best_dir = None if best_dir is None else os.fspath(best_dir)
        self.configuration = configuration

    def best_directory(self, trainer):
        """Where the best checkpoint goes: ``best_dir`` (BestCkptSaverHook's ``save_dir``, inside the
        storage dir unless absolute), else the checkpoint directory."""
        return storage.join(trainer.storage_dir, self.best_dir) if self.best_dir else self.checkpoint_dir(trainer)

    def setup(self, trainer):
        super().setup(trainer)
        if self.best is not None:
            self.best.bind(self.best_directory(trainer))

    def output_dirs(self, trainer):
        """The checkpoint directory and the inference folders (``output``, and ``output_best`` with
        a best metric): relative ones stay inside the work dir, an absolute one is logged and locked
        with it (``engine/preflight.py``)."""
        dirs = super().output_dirs(trainer)
        dirs['output'] = storage.join(trainer.storage_dir, self.output_dir)
        if self.best is not None:
            dirs['output_best'] = storage.join(trainer.storage_dir, self.best_output_dir)
            if self.best_dir:
                dirs['best checkpoint'] = self.best_directory(trainer)
        return dirs

    def before_run(self, trainer):
        super().before_run(trainer)
        if trainer.rank != 0:
            return
        text = json.dumps(self.configuration if self.configuration is not None else {}, indent=4, default=repr)
        folders = [self.output_dir] + ([self.best_output_dir] if self.best is not None else [])
        for folder in folders:
            folder = storage.join(trainer.storage_dir, folder)
            storage.makedirs(folder)
            atomic_write(storage.join(folder, CONFIGURATION), lambda f: f.write(text.encode()))
            if self.copies_model_files:
                copy_model_files(trainer, folder)

    copies_model_files = True  # ModelScope's output/ has the model directory's other files too

    def _save(self, trainer, filename):
        super()._save(trainer, filename)
        self._export(trainer, self.output_dir)

    def _track_best(self, trainer, filename):
        if self.best is None:
            return

        def write(path, on_disk):
            self._write(trainer, path, update_last=False, on_disk=on_disk)
            self._export(trainer, self.best_output_dir)
        directory = self.best_directory(trainer)
        if directory != self.directory and trainer.rank == 0:
            storage.makedirs(directory)
        self.best.update(trainer, directory, filename, write)

    def _export(self, trainer, folder):
        if trainer.rank != 0:
            return
        if is_sharded_model(trainer.wrapped_model):  # the weights are spread over the ranks
            if not getattr(self, '_warned_sharded', False):
                trainer.logger.warning('ModelScope %s/%s is not written for a sharded (FSDP) model; '
                                       'the checkpoints hold the weights', folder, MODEL_FILE)
                self._warned_sharded = True
            return
        folder = storage.join(trainer.storage_dir, folder)
        storage.makedirs(folder)
        state = trainer.model.state_dict()  # through the weights gate: finite, atomic, with its sidecar
        trainer.checkpointer.export_file(storage.join(folder, MODEL_FILE), lambda f: f.write(_state_dict_bytes(state)),
                                         state)
        if trainer.metrics:
            metrics = json.dumps({k: float(v) if isinstance(v, torch.Tensor) and v.numel() == 1 else v
                                  for k, v in trainer.metrics.items()}, default=repr)
            atomic_write(storage.join(folder, EVAL_RESULT_FILE), lambda f: f.write(metrics.encode()))


@HOOKS.register_module()
class ModelScopeTextLoggerHook(TextLoggerHook):
    """``TextLoggerHook`` whose JSON-lines log uses ModelScope's keys, ``'eval'`` mode and, by
    epoch, ``iter`` counted within the epoch."""

    _iters_per_epoch = None

    def log(self, trainer, record):
        self._iters_per_epoch = trainer.iters_per_epoch if self.by_epoch else None
        super().log(trainer, record)

    def _write_json(self, record):
        if 'mode' not in record:
            return  # hookloop's first line (seed, work dir): ModelScope's log has records only
        super()._write_json(modelscope_record(record, self._iters_per_epoch))


@HOOKS.register_module()
class ModelScopeTensorboardHook(TensorboardLoggerHook):
    """``TensorboardLoggerHook`` in ``<work_dir>/tensorboard_output`` with ModelScope's tags."""

    def __init__(self, log_dir=None, interval=10, ignore_last=True, by_epoch=True,
                 skip_keys=('iter_time', 'data_load_time')):
        super().__init__(log_dir, interval, ignore_last, by_epoch)
        hookloop_names = {v: k for k, v in RECORD_KEYS.items()}
        self.skip = {hookloop_names.get(k, k) for k in skip_keys}

    def open(self, trainer):
        if self.log_dir is None:
            self.log_dir = os.path.join(trainer.work_dir, 'tensorboard_output')
        super().open(trainer)

    def log(self, trainer, record):
        for key, value in self.metrics_of(record).items():
            if key not in self.skip:
                self.writer.add_scalar(key, value, record['iter'])


__all__ = ['ModelScopeCheckpointHook', 'ModelScopeTextLoggerHook', 'ModelScopeTensorboardHook', 'modelscope_record']
