"""ModelScope's ``configuration.json`` and ``build_trainer(default_args=dict(cfg_file=...))``.

The file's sections map onto the Trainer (docs/migration.md has the table): ``model`` (a
registered type), ``dataset.train`` / ``dataset.val`` (registered types), ``train.work_dir``,
``train.max_epochs``, ``train.train_iters_per_epoch``, ``train.dataloader``, ``train.optimizer``
(+ ``options.grad_clip``, ``options.cumulative_iters``), ``train.lr_scheduler`` (a torch
scheduler, + ``options.warmup``, ``options.by_epoch``), ``train.hooks`` and the current sections
``train.checkpoint`` / ``train.logging`` / ``evaluation.period`` with ModelScope's default hooks
(:mod:`.modelscope_train`), ``evaluation.dataloader``, ``evaluation.val_iters_per_epoch`` and
``evaluation.metrics`` (:mod:`.modelscope_metrics`). Runs from such a file write ModelScope's
names back (:mod:`.modelscope_hooks`). ``framework``, ``task`` and ``pipeline`` describe inference and are
only checked. What hookloop cannot do (hub model ids, hub datasets, preprocessors) is
refused in one line that names every such piece.
"""
import copy
from collections.abc import Mapping

from ..errors import ConfigError
from .modelscope_config import load_configuration
from .modelscope_train import checkpoint_args, evaluation_hook, follow_work_dir, logger_hook, merged_hooks

# What the CLI and build_trainer use; users reach it through them (docs/api.md).
__all__ = ['looks_like_modelscope', 'translate', 'trainer_args']

MODELSCOPE_SEED = 42  # ModelScope's default seed (EpochBasedTrainer's seed=42)
_SECTIONS = ('framework', 'task', 'pipeline', 'preprocessor', 'model', 'dataset', 'train', 'evaluation')
_LOADER_KEYS = {'batch_size_per_gpu': 'batch_size', 'workers_per_gpu': 'num_workers', 'shuffle': 'shuffle',
                'drop_last': 'drop_last', 'pin_memory': 'pin_memory'}


def looks_like_modelscope(cfg):
    """A ModelScope configuration: a ``train`` section (a dict), or ``framework`` beside ``task``."""
    return isinstance(cfg.get('train'), Mapping) or ('framework' in cfg and 'task' in cfg)


def translate(cfg, configuration=None, extras=None):
    """Trainer arguments from a ModelScope configuration (other hookloop keys pass through).
    ``configuration``: what ``output/configuration.json`` records (default: ``cfg``'s sections);
    ``extras``: a dict that receives what ``build_trainer(optimizers=...)`` needs."""
    cfg = dict(cfg)
    ms = {key: cfg.pop(key) for key in _SECTIONS if key in cfg}
    if configuration is None:
        configuration = {k: v for k, v in ms.items()}
    ms = {k: (copy.deepcopy(v) if k in ('train', 'evaluation') else v) for k, v in ms.items()}
    unsupported, out = [], {}
    framework = ms.get('framework', 'pytorch')
    if framework not in ('pytorch', 'torch'):
        unsupported.append(f'framework {framework!r} (hookloop trains PyTorch models)')
    if ms.get('preprocessor'):  # None / {} mean "absent"
        unsupported.append('preprocessor (ModelScope preprocessors; turn samples into tensors in the dataset)')
    model = ms.get('model')
    if isinstance(model, str):
        unsupported.append(f'hub model id {model!r} (give model=dict(type=...) of a registered model or an nn.Module)')
    elif isinstance(model, Mapping):
        for key in ('model_id', 'model_dir', 'pretrained_model'):
            if key in model:
                unsupported.append(f'model.{key} {model[key]!r} (hub/pretrained models are not downloaded)')
        out['model'] = dict(model)
    elif model is not None:
        out['model'] = model
    datasets = ms.get('dataset') or {}
    for split, target in (('train', 'train_dataloader'), ('val', 'val_dataloader')):
        spec = datasets.get(split)
        if spec is None:
            continue
        if isinstance(spec, Mapping) and 'type' not in spec:
            unsupported.append(f'dataset.{split} without a "type" ({sorted(spec)}: hub datasets/MsDataset '
                               'are not loaded; register a dataset type or pass train_dataset=)')
            continue
        out[target] = {'dataset': spec}
    if unsupported:
        raise ConfigError('ModelScope configuration: not supported: ' + '; '.join(unsupported))
    problems = []
    if cfg.get('work_dir') is not None:
        follow_work_dir(ms)
    hooks = merged_hooks(ms, problems)  # ModelScope's defaults and current sections
    train = dict(ms.get('train') or {})
    train.pop('hooks', None)
    _train_section(train, hooks, out, problems, configuration)
    _evaluation_section(dict(ms.get('evaluation') or {}), out, problems, ms.get('task'))
    if problems:
        raise ConfigError('ModelScope configuration: ' + '; '.join(problems))
    for key in ('_lr_hook', '_cumulative_iters'):
        value = out.pop(key, None)
        if extras is not None:
            extras[key] = value
    out['seed'] = MODELSCOPE_SEED  # EpochBasedTrainer(seed=42): a configuration trains the same way each time
    out.update(cfg)  # explicit hookloop keys (work_dir from the CLI, seed, device, ...) win
    return out


def _loader_options(section, what, problems):
    options = {}
    for key, value in (section or {}).items():
        if key not in _LOADER_KEYS:
            problems.append(f'{what} got unknown key {key!r} (known: {", ".join(_LOADER_KEYS)})')
        else:
            options[_LOADER_KEYS[key]] = value
    return options


def _is_stream(dataset):
    """An IterableDataset (object, class or registered type): ModelScope does not shuffle it."""
    from torch.utils.data import IterableDataset

    from ..registry import DATASETS
    if isinstance(dataset, Mapping):
        kind = dataset.get('type')
        kind = DATASETS.get(kind) if isinstance(kind, str) and kind in DATASETS else kind
        return isinstance(kind, type) and issubclass(kind, IterableDataset)
    from ..data.hf_dataset import is_hf_iterable
    return isinstance(dataset, IterableDataset) or is_hf_iterable(dataset)


def _train_section(train, hooks, out, problems, configuration):
    from . import modelscope_hooks  # noqa: F401  (registers the ModelScope-named hooks)
    for key in ('work_dir', 'max_epochs', 'max_iters'):
        if key in train:
            out[key] = train.pop(key)
    if train.get('train_iters_per_epoch') is not None:
        out['iters_per_epoch'] = train.pop('train_iters_per_epoch')
    train.pop('train_iters_per_epoch', None)
    options = _loader_options(train.pop('dataloader', None), 'train.dataloader', problems)
    if 'train_dataloader' in out:
        loader = {**options, **out['train_dataloader']}
        loader.setdefault('shuffle', not _is_stream(loader['dataset']))
        out['train_dataloader'] = loader
    optimizer_config = {}
    optimizer = train.pop('optimizer', None)
    if optimizer is not None:
        optimizer = dict(optimizer)
        optimizer_config.update(optimizer.pop('options', None) or {})
        out['optimizer'] = optimizer
    scheduler = train.pop('lr_scheduler', None)
    extra = [dict(h, type=h.get('type', default)) for h, default in
             ((train.pop('optimizer_hook', None), 'OptimizerHook'), (train.pop('lr_scheduler_hook', None),
                                                                     'LrSchedulerHook')) if h]
    lr_hook = {}
    log_hooks, custom_hooks, evaluation = [], [], None
    for hook in hooks + extra:
        hook = dict(hook)
        kind = hook.pop('type', None)
        if kind in ('CheckpointHook', 'BestCkptSaverHook'):
            continue  # below, as one hook
        if kind in ('TextLoggerHook', 'TensorboardHook'):
            log_hooks.append(logger_hook(kind, hook))
        elif kind == 'IterTimerHook':
            out['timer_config'] = dict(type='IterTimerHook', **hook)
        elif kind == 'EvaluationHook':
            evaluation = evaluation_hook(hook)
        elif kind == 'LrSchedulerHook':
            lr_hook.update(hook)
        elif kind == 'DDPHook':  # hookloop joins torchrun itself: the hook's launcher is the Trainer's
            out['launcher'] = hook.pop('launcher', 'pytorch')
        elif kind == 'LoadCheckpointHook':  # load_all_state: continue the run; else weights only
            hook.pop('strict', None)  # hookloop loads a checkpoint's weights strictly
            out['resume_from' if hook.pop('load_all_state', True) else 'load_from'] = hook.pop('checkpoint_file', None)
            if hook:
                problems.append(f'LoadCheckpointHook got arguments hookloop does not know: {sorted(hook)}')
        elif kind in ('OptimizerHook', 'TorchAMPOptimizerHook'):
            if kind == 'TorchAMPOptimizerHook':
                optimizer_config['precision'] = 'fp16'
            optimizer_config.update(hook)
        else:  # a hook registered in hookloop's HOOKS (the registry names the closest ones otherwise)
            custom_hooks.append(dict(type=kind, **hook))
    checkpoint = checkpoint_args(hooks, problems)
    if scheduler is not None:
        try:
            out['lr_config'] = _lr_config(dict(scheduler), lr_hook, optimizer_config.get('cumulative_iters', 1))
        except ConfigError as exc:
            problems.append(str(exc))
    elif lr_hook:
        out['_lr_hook'] = lr_hook  # options for build_trainer(optimizers=(opt, scheduler))
    out['_cumulative_iters'] = optimizer_config.get('cumulative_iters', 1)
    if optimizer_config:
        out['optimizer_config'] = optimizer_config
    out['checkpoint_config'] = dict(type='ModelScopeCheckpointHook', configuration=configuration, **checkpoint)
    if log_hooks:
        out['log_config'] = dict(interval=log_hooks[0].get('interval', 10), hooks=log_hooks)
    if custom_hooks:
        out['custom_hooks'] = custom_hooks
    if evaluation is not None:
        out['evaluation'] = evaluation
    if train:
        problems.append(f'train got keys hookloop does not know: {sorted(train)}')


def _lr_config(scheduler, lr_hook, cumulative_iters=1):
    """TorchSchedulerHook config: ``options`` (``warmup``, ``by_epoch``) and the hook's own
    ``by_epoch`` / ``warmup``; stepped per iteration, the first ``cumulative_iters - 1``
    steps are left out as ModelScope's LrSchedulerHook does."""
    import torch

    from .modelscope_warmup import AccumulationDelay, WarmupScheduler
    options = dict(scheduler.pop('options', None) or {})
    lr_hook = dict(lr_hook)
    by_epoch = options.pop('by_epoch', lr_hook.pop('by_epoch', True))
    warmup = options.pop('warmup', lr_hook.pop('warmup', None))
    if options:
        raise ConfigError(f'lr_scheduler.options got {sorted(options)}; known: warmup, by_epoch')
    if lr_hook:
        raise ConfigError(f'LrSchedulerHook got {sorted(lr_hook)}; known: by_epoch, warmup')
    built = scheduler.pop('_built', None)
    if built is None:
        kind = getattr(torch.optim.lr_scheduler, str(scheduler.get('type')), None)
        if not (isinstance(kind, type) and issubclass(kind, torch.optim.lr_scheduler.LRScheduler)):
            raise ConfigError(f'lr_scheduler type must name a torch scheduler, got {scheduler.get("type")!r}')
        scheduler.pop('type')
    delay = 1 if by_epoch else cumulative_iters
    if warmup is None and delay == 1 and built is None:
        return dict(type='TorchSchedulerHook', scheduler=dict(type=kind.__name__, **scheduler), by_epoch=by_epoch)
    warmup = dict(warmup) if warmup is not None else None

    def build(optimizer):
        result = built if built is not None else kind(optimizer, **scheduler)
        if warmup is not None:
            result = WarmupScheduler(result, **warmup)
        return AccumulationDelay(result, delay) if delay > 1 else result
    return dict(type='TorchSchedulerHook', by_epoch=by_epoch, scheduler=build)


def _evaluation_section(evaluation, out, problems, task=None):
    from .modelscope_metrics import TASK_METRICS, metric
    # ModelScope hands it to its trainer's visualization(), which does nothing unless a trainer subclass
    # overrides it: a documented no-op for the trainers hookloop builds.
    evaluation.pop('visualization', None)
    if evaluation.get('val_iters_per_epoch') is not None:
        out['val_iters'] = evaluation.pop('val_iters_per_epoch')
    evaluation.pop('val_iters_per_epoch', None)
    options = _loader_options(evaluation.pop('dataloader', None), 'evaluation.dataloader', problems)
    if 'val_dataloader' in out:
        out['val_dataloader'] = {'shuffle': False, **options, **out['val_dataloader']}
    metrics = evaluation.pop('metrics', None)
    if metrics is None and 'val_dataloader' in out and 'val_evaluator' not in out:
        metrics = TASK_METRICS.get(task)  # ModelScope's default metrics of the task
    if metrics is not None:
        metrics = [metrics] if isinstance(metrics, (str, Mapping)) else list(metrics)
        try:
            evaluators = [metric(m) for m in metrics]
        except ConfigError as exc:
            problems.append(str(exc))
        else:
            out['val_evaluator'] = evaluators[0] if len(evaluators) == 1 else MetricList(evaluators)
    if evaluation:
        problems.append(f'evaluation got keys hookloop does not know: {sorted(evaluation)}')


class MetricList:
    """Several evaluators, one dict of metrics."""

    def __init__(self, evaluators):
        self.evaluators = evaluators

    def reset(self):
        for evaluator in self.evaluators:
            evaluator.reset()

    def update(self, outputs, batch):
        for evaluator in self.evaluators:
            evaluator.update(outputs, batch)

    def compute(self):
        metrics = {}
        for evaluator in self.evaluators:
            metrics.update(evaluator.compute())
        return metrics


_MS_ARGUMENTS = ('use_fp16', 'train_iters_per_epoch', 'val_iters_per_epoch')


def trainer_args(default_args, cfg=None):
    """ModelScope's ``build_trainer`` arguments (``cfg_file``, ``cfg_modify_fn``, ``cfg_options``,
    ``model``, ``train_dataset``, ``eval_dataset``, ``data_collator``, ``optimizers``,
    ``callbacks``, ``work_dir``, ``seed``, ``max_epochs``, ``use_fp16``,
    ``train_iters_per_epoch``, ``val_iters_per_epoch``, ...) as Trainer arguments. Datasets
    passed in take the file's ``train.dataloader`` / ``evaluation.dataloader`` options.
    ``cfg``: the configuration already loaded (:func:`~.modelscope_config.load_configuration`)
    instead of ``cfg_file``."""
    args = dict(default_args)
    if cfg is None:
        cfg = load_configuration(args.pop('cfg_file'), args.pop('cfg_modify_fn', None),
                                 args.pop('cfg_options', None))
    for name in ('arg_parse_fn', 'preprocessor', 'model_revision', 'samplers', 'efficient_tuners'):
        if args.get(name) is not None:
            raise ConfigError(f'ModelScope build_trainer argument {name!r} is not supported')
        args.pop(name, None)
    model = args.pop('model', None)
    if isinstance(model, str):
        raise ConfigError(f'ModelScope configuration: not supported: hub model id {model!r} (pass an nn.Module)')
    cfg = cfg.to_dict()
    configuration = copy.deepcopy(cfg)  # output/configuration.json: the file's config
    if model is not None:
        cfg['model'] = model  # an nn.Module replaces the file's model section
    datasets = dict(cfg.get('dataset') or {})
    for split, name in (('train', 'train_dataset'), ('val', 'eval_dataset')):
        if args.get(name) is not None:  # given objects replace the file's datasets, its loader options stay
            given = args[name]
            if isinstance(given, (list, tuple)):  # ModelScope concatenates a list of datasets
                from torch.utils.data import ConcatDataset
                given = ConcatDataset(list(given))
            datasets[split] = given
        args.pop(name, None)
    cfg['dataset'] = datasets
    if args.get('work_dir') is not None:
        cfg['work_dir'] = args.pop('work_dir')
    given = {name: args.pop(name) for name in _MS_ARGUMENTS if name in args}
    if given.get('train_iters_per_epoch') is not None:
        cfg.setdefault('train', {})['train_iters_per_epoch'] = given['train_iters_per_epoch']
    if given.get('val_iters_per_epoch') is not None:
        cfg.setdefault('evaluation', {})['val_iters_per_epoch'] = given['val_iters_per_epoch']
    extras = {}
    kwargs = translate(cfg, configuration, extras)
    lr_hook, cumulative_iters = extras['_lr_hook'] or {}, extras['_cumulative_iters'] or 1
    if given.get('use_fp16'):  # ModelScope registers TorchAMPOptimizerHook
        kwargs['optimizer_config'] = {**kwargs.get('optimizer_config', {}), 'precision': 'fp16'}
    collator = args.pop('data_collator', None)
    if collator is not None:
        collators = collator if isinstance(collator, Mapping) else {'train': collator, 'val': collator}
        for split, target in (('train', 'train_dataloader'), ('val', 'val_dataloader')):
            if target in kwargs and collators.get(split) is not None:
                kwargs[target]['collate_fn'] = collators[split]
    optimizers = args.pop('optimizers', None)
    if optimizers is not None and optimizers[0] is not None:
        kwargs['optimizer'] = optimizers[0]
        if len(optimizers) > 1 and optimizers[1] is not None:
            kwargs['lr_config'] = _lr_config({'_built': optimizers[1]}, lr_hook, cumulative_iters)
    callbacks = args.pop('callbacks', None)
    if callbacks:
        callbacks = [callbacks] if callable(callbacks) and not isinstance(callbacks, (list, tuple)) else callbacks
        kwargs['custom_hooks'] = list(kwargs.get('custom_hooks', [])) + list(callbacks)
    if args.get('device') == 'gpu':  # ModelScope's name
        args['device'] = 'cuda'
    compile_options = args.pop('compile_options', None)
    if args.get('compile') and compile_options:
        args['compile'] = dict(compile_options)
    if args.pop('remove_unused_data', False):
        raise ConfigError('ModelScope build_trainer argument remove_unused_data=True is not supported '
                          "(give the model's forward a **kwargs or drop the keys in data_collator)")
    _refuse_unknown(args)
    kwargs.update(args)
    return kwargs


def _refuse_unknown(args):
    """ModelScope's trainer takes ``**kwargs``; an argument hookloop has no use for is refused
    here rather than ignored (the Trainer's own arguments, ``work_dir``, ``seed``, ... pass)."""
    import inspect

    from ..engine.trainer import Trainer
    known = set(inspect.signature(Trainer.__init__).parameters) - {'self', 'mmcv_keys'}
    unknown = sorted(name for name in args if name not in known)
    if unknown:
        raise ConfigError(f'ModelScope build_trainer arguments not supported: {", ".join(unknown)} '
                          f'(supported besides cfg_file: model, train_dataset, eval_dataset, data_collator, '
                          f'optimizers, callbacks, cfg_modify_fn, cfg_options, {", ".join(_MS_ARGUMENTS)}, '
                          "and the Trainer's arguments such as work_dir, seed, max_epochs, device, launcher)")
