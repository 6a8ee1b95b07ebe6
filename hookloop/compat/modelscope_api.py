"""The names ModelScope training code imports, in one module: point ``modelscope.trainers``,
``modelscope.metainfo``, ``modelscope.msdatasets``, ``modelscope.pipelines``,
``modelscope.trainers.training_args`` and ``modelscope.utils.constant`` at it and ModelScope's
DreamBooth and LoRA examples run on hookloop (docs/migration.md, "ModelScope scripts").

The constants are ModelScope's values; the behaviour is hookloop's: :func:`build_trainer`
(ModelScope's ``'dreambooth-diffusion'``, ``'lora-diffusion'`` and ``'trainer'`` with a
``cfg_file``), :class:`MsDataset` (local dataset directories), :func:`pipeline` (local
text-to-image model directories) and :class:`TrainingArgs`.
"""
import torch

from .build import build_trainer
from .modelscope_args import TrainingArgs
from .modelscope_dataset import MsDataset
from .modelscope_pipeline import pipeline
from ..engine.trainer import Trainer as EpochBasedTrainer
from ..registry import METRICS as _METRICS

default_group = 'default'  # ``modelscope.utils.registry.default_group``: hookloop's registries have no groups


class Model:
    """``modelscope.models.base.Model``'s part hookloop reads: ``model_dir``, the directory the
    model came from (its other files are copied into ``output/``)."""
    model_dir = None


class TorchModel(torch.nn.Module, Model):
    """``modelscope.models.base.TorchModel``: an ``nn.Module`` with a ``model_dir``."""

    def __init__(self, model_dir=None, *args, **kwargs):
        super().__init__()
        self.model_dir = model_dir


class ModelScopeRegistry:
    """A hookloop registry under ModelScope's calls: ``register_module(group_key=...,
    module_name=..., module_cls=..., force=...)`` (the group is ignored) and ``get(name)``."""

    def __init__(self, registry):
        self.registry = registry

    def register_module(self, group_key=default_group, module_name=None, module_cls=None, force=False):
        if module_cls is not None:
            return self.registry.register_module(module=module_cls, module_name=module_name, force=force)
        return self.registry.register_module(module_name=module_name, force=force)

    def get(self, name, group_key=default_group):
        return self.registry.get(name)


METRICS = ModelScopeRegistry(_METRICS)  # ``modelscope.metrics.builder.METRICS``


class Trainers:
    """``modelscope.metainfo.Trainers``: the registered names hookloop has."""
    default = 'trainer'
    dreambooth_diffusion = 'dreambooth-diffusion'
    lora_diffusion = 'lora-diffusion'


class Tasks:
    """``modelscope.utils.constant.Tasks`` (the tasks hookloop's ModelScope support reads)."""
    text_to_image_synthesis = 'text-to-image-synthesis'
    text_classification = 'text-classification'
    image_classification = 'image-classification'


class DownloadMode:
    """``modelscope.utils.constant.DownloadMode``: nothing is downloaded; accepted and unused."""
    REUSE_DATASET_IF_EXISTS = 'reuse_dataset_if_exists'
    FORCE_REDOWNLOAD = 'force_redownload'


class ModelFile:
    """``modelscope.utils.constant.ModelFile``: the file names a run writes."""
    CONFIGURATION = 'configuration.json'
    TORCH_MODEL_BIN_FILE = 'pytorch_model.bin'
    TORCH_MODEL_FILE = 'pytorch_model.pt'
    TRAIN_OUTPUT_DIR = 'output'
    TRAIN_BEST_OUTPUT_DIR = 'output_best'


class LogKeys:
    """``modelscope.utils.constant.LogKeys``: the keys of the JSON log records."""
    ITER_TIME = 'iter_time'
    DATA_LOAD_TIME = 'data_load_time'
    EPOCH = 'epoch'
    ITER = 'iter'
    MODE = 'mode'
    LR = 'lr'
    LOSS = 'loss'
    MEMORY = 'memory'


class ModeKeys:
    """``modelscope.utils.constant.ModeKeys``."""
    TRAIN = 'train'
    EVAL = 'eval'
    INFERENCE = 'inference'


class Metrics:
    """``modelscope.metainfo.Metrics``: the metric names hookloop computes (docs/migration.md)."""
    accuracy = 'accuracy'
    seq_cls_metric = 'seq-cls-metric'
    loss_metric = 'loss-metric'
    precision = 'precision'
    recall = 'recall'
    f1 = 'f1'


class MetricKeys:
    """``modelscope.metrics.builder.MetricKeys``: the keys of their results."""
    ACCURACY = 'accuracy'
    PRECISION = 'precision'
    RECALL = 'recall'
    F1 = 'f1'
    LOSS = 'loss'


class TrainerStages:
    """``modelscope.utils.constant.TrainerStages``: the hook stages (hookloop's names)."""
    before_run = 'before_run'
    before_train_epoch = 'before_train_epoch'
    before_train_iter = 'before_train_iter'
    after_train_iter = 'after_train_iter'
    after_train_epoch = 'after_train_epoch'
    before_val_epoch = 'before_val_epoch'
    before_val_iter = 'before_val_iter'
    after_val_iter = 'after_val_iter'
    after_val_epoch = 'after_val_epoch'
    after_run = 'after_run'


class OutputKeys:
    """``modelscope.outputs.OutputKeys``."""
    LOSS = 'loss'
    LOGITS = 'logits'
    OUTPUT_IMGS = 'output_imgs'


__all__ = ['build_trainer', 'EpochBasedTrainer', 'TrainingArgs', 'MsDataset', 'pipeline', 'Model', 'TorchModel',
           'METRICS', 'default_group', 'Trainers', 'Tasks', 'DownloadMode', 'ModelFile', 'LogKeys', 'ModeKeys',
           'Metrics', 'MetricKeys', 'TrainerStages', 'OutputKeys']
