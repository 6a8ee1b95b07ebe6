"""ModelScope's ``configuration.json`` and ``build_trainer(default_args=dict(cfg_file=...))``.

The file's sections map onto the Trainer (docs/migration.md has the table): ``model`` (a
registered type), ``dataset.train`` / ``dataset.val`` (registered types), ``train.work_dir``,
``train.max_epochs``, ``train.dataloader``, ``train.optimizer`` (+ ``options.grad_clip``,
``options.cumulative_iters``), ``train.lr_scheduler`` (a torch scheduler, + ``options.warmup``,
``options.by_epoch``), ``train.hooks`` (ModelScope's hook names), ``evaluation.dataloader`` and
``evaluation.metrics``. ``framework``, ``task`` and ``pipeline`` describe inference and are
only checked. What hookloop cannot do (hub model ids, hub datasets, preprocessors) is
refused in one line that names every such piece.
"""
import copy
from collections.abc import Mapping

from ..config import Config, load_config
from ..errors import ConfigError
from ..registry import METRICS

_SECTIONS = ('framework', 'task', 'pipeline', 'preprocessor', 'model', 'dataset', 'train', 'evaluation')
_LOADER_KEYS = {'batch_size_per_gpu': 'batch_size', 'workers_per_gpu': 'num_workers', 'shuffle': 'shuffle',
                'drop_last': 'drop_last', 'pin_memory': 'pin_memory'}
_HOOK_NAMES = {'TextLoggerHook': 'TextLoggerHook', 'TensorboardHook': 'TensorboardLoggerHook',
               'IterTimerHook': 'IterTimerHook'}


def looks_like_modelscope(cfg):
    """A ModelScope configuration: a ``train`` section (a dict), or ``framework`` beside ``task``."""
    return isinstance(cfg.get('train'), Mapping) or ('framework' in cfg and 'task' in cfg)


def translate(cfg):
    """Trainer arguments from a ModelScope configuration (other hookloop keys pass through)."""
    cfg = dict(cfg)
    ms = {key: cfg.pop(key) for key in _SECTIONS if key in cfg}
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
    train = dict(ms.get('train') or {})
    problems = []
    _train_section(train, out, problems)
    _evaluation_section(dict(ms.get('evaluation') or {}), out, problems)
    if problems:
        raise ConfigError('ModelScope configuration: ' + '; '.join(problems))
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


def _train_section(train, out, problems):
    for key in ('work_dir', 'max_epochs', 'max_iters'):
        if key in train:
            out[key] = train.pop(key)
    options = _loader_options(train.pop('dataloader', None), 'train.dataloader', problems)
    if 'train_dataloader' in out:
        out['train_dataloader'] = {'shuffle': True, **options, **out['train_dataloader']}
    optimizer_config = {}
    optimizer = train.pop('optimizer', None)
    if optimizer is not None:
        optimizer = dict(optimizer)
        optimizer_config.update(optimizer.pop('options', None) or {})
        out['optimizer'] = optimizer
    scheduler = train.pop('lr_scheduler', None)
    hooks = train.pop('hooks', None) or []
    lr_by_epoch = None
    log_hooks, custom_hooks, checkpoint, evaluation = [], [], {}, None
    for hook in hooks:
        hook = dict(hook)
        kind = hook.pop('type', None)
        if kind == 'CheckpointHook':
            checkpoint.update(_checkpoint_args(hook))
        elif kind == 'BestCkptSaverHook':
            best = _checkpoint_args(hook)
            best['save_best'] = best.pop('metric_key', 'auto')
            best['rule'] = {'max': 'greater', 'min': 'less'}.get(best.get('rule', 'max'), best.get('rule'))
            checkpoint = {'interval': -1, **checkpoint, **best} if not checkpoint else {**checkpoint, **best}
        elif kind in ('TextLoggerHook', 'TensorboardHook'):
            if kind == 'TensorboardHook' and 'out_dir' in hook:
                hook['log_dir'] = hook.pop('out_dir')
            log_hooks.append(dict(type=_HOOK_NAMES[kind], **hook))
        elif kind == 'IterTimerHook':
            out['timer_config'] = dict(type='IterTimerHook', **hook)
        elif kind == 'EvaluationHook':
            evaluation = hook
        elif kind == 'LrSchedulerHook':
            lr_by_epoch = hook.pop('by_epoch', None)
            if hook:
                problems.append(f'LrSchedulerHook got {sorted(hook)}; put the schedule in train.lr_scheduler')
        elif kind in ('OptimizerHook', 'TorchAMPOptimizerHook'):
            if kind == 'TorchAMPOptimizerHook':
                optimizer_config['precision'] = 'fp16'
            optimizer_config.update(hook)
        else:  # a hook registered in hookloop's HOOKS (the registry names the closest ones otherwise)
            custom_hooks.append(dict(type=kind, **hook))
    if scheduler is not None:
        out['lr_config'] = _lr_config(dict(scheduler), lr_by_epoch)
    if optimizer_config:
        out['optimizer_config'] = optimizer_config
    if checkpoint:
        out['checkpoint_config'] = checkpoint
    if log_hooks:
        out['log_config'] = dict(interval=log_hooks[0].get('interval', 10), hooks=log_hooks)
    if custom_hooks:
        out['custom_hooks'] = custom_hooks
    if evaluation is not None:
        out['evaluation'] = evaluation
    if train:
        problems.append(f'train got keys hookloop does not know: {sorted(train)}')


def _checkpoint_args(hook):
    renamed = {'output_dir': 'out_dir', 'max_checkpoint_num': 'max_keep_ckpts'}
    return {renamed.get(k, k): v for k, v in hook.items()}


def _lr_config(scheduler, hook_by_epoch):
    options = dict(scheduler.pop('options', None) or {})
    by_epoch = options.pop('by_epoch', True if hook_by_epoch is None else hook_by_epoch)
    warmup = options.pop('warmup', None)
    if options:
        raise ConfigError(f'ModelScope lr_scheduler.options got {sorted(options)}; known: warmup, by_epoch')
    if warmup is None:
        return dict(type='TorchSchedulerHook', scheduler=scheduler, by_epoch=by_epoch)
    import torch

    from .modelscope_warmup import WarmupScheduler
    kind = getattr(torch.optim.lr_scheduler, str(scheduler.pop('type', None)), None)
    if not (isinstance(kind, type) and issubclass(kind, torch.optim.lr_scheduler.LRScheduler)):
        raise ConfigError(f'ModelScope lr_scheduler type must name a torch scheduler, got {kind!r}')
    warmup = dict(warmup)
    return dict(type='TorchSchedulerHook', by_epoch=by_epoch,
                scheduler=lambda optimizer: WarmupScheduler(kind(optimizer, **scheduler), **warmup))


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


def _metric(spec):
    """A metric from a ModelScope name (``'accuracy'``, ``'seq-cls-metric'``...) or dict."""
    from ..evaluation import build_evaluator
    if isinstance(spec, Mapping):
        return build_evaluator(spec)
    if spec in METRICS:
        return build_evaluator(dict(type=spec))
    simple = spec.replace('-', '').replace('_', '').lower()
    if simple in ('accuracy', 'acc'):  # ModelScope's accuracy: outputs['logits'] against batch['labels']
        return build_evaluator(dict(type='Accuracy', pred_key='logits', target_key='labels'))
    by_simple = {k.replace('_', '').lower(): k for k in METRICS.keys()}
    if simple in by_simple:
        return build_evaluator(dict(type=by_simple[simple]))
    raise ConfigError(f'ModelScope evaluation metric {spec!r} is not registered in hookloop METRICS '
                      f'(registered: {", ".join(METRICS.keys())})')


def _evaluation_section(evaluation, out, problems):
    options = _loader_options(evaluation.pop('dataloader', None), 'evaluation.dataloader', problems)
    if 'val_dataloader' in out:
        out['val_dataloader'] = {**options, **out['val_dataloader']}
    metrics = evaluation.pop('metrics', None)
    if metrics is not None:
        metrics = [metrics] if isinstance(metrics, (str, Mapping)) else list(metrics)
        try:
            evaluators = [_metric(m) for m in metrics]
        except ConfigError as exc:
            problems.append(str(exc))
        else:
            out['val_evaluator'] = evaluators[0] if len(evaluators) == 1 else MetricList(evaluators)
    if evaluation:
        problems.append(f'evaluation got keys hookloop does not know: {sorted(evaluation)}')


def trainer_args(default_args):
    """ModelScope's ``build_trainer`` arguments (``cfg_file``, ``cfg_modify_fn``, ``model``,
    ``train_dataset``, ``eval_dataset``, ``data_collator``, ``optimizers``, ``callbacks``,
    ``work_dir``, ``seed``, ...) as Trainer arguments."""
    args = dict(default_args)
    cfg = Config(load_config(args.pop('cfg_file')))
    modify = args.pop('cfg_modify_fn', None)
    if modify is not None:
        cfg = modify(cfg)
        if not isinstance(cfg, Mapping):
            raise ConfigError(f'cfg_modify_fn must return the config, got {type(cfg).__name__}')
    cfg = Config(copy.deepcopy(dict(cfg)))
    for name in ('arg_parse_fn', 'preprocessor', 'model_revision', 'samplers', 'efficient_tuners'):
        if args.get(name) is not None:
            raise ConfigError(f'ModelScope build_trainer argument {name!r} is not supported')
        args.pop(name, None)
    model = args.pop('model', None)
    if isinstance(model, str):
        raise ConfigError(f'ModelScope configuration: not supported: hub model id {model!r} (pass an nn.Module)')
    if model is not None:
        cfg['model'] = model  # an nn.Module replaces the file's model section
    objects = {split: args.pop(name) for split, name in (('train', 'train_dataset'), ('val', 'eval_dataset'))
               if args.get(name) is not None}
    args.pop('train_dataset', None), args.pop('eval_dataset', None)
    collator = args.pop('data_collator', None)
    cfg = cfg.to_dict()
    datasets = {k: v for k, v in (cfg.get('dataset') or {}).items() if k not in objects}  # given objects win
    cfg['dataset'] = datasets
    kwargs = translate(cfg)
    for split, target in (('train', 'train_dataloader'), ('val', 'val_dataloader')):
        if split in objects:
            kwargs[target] = {**kwargs.get(target, {}), 'dataset': objects[split]}
            if split == 'train':
                kwargs[target].setdefault('shuffle', True)
    if collator is not None:
        for target in ('train_dataloader', 'val_dataloader'):
            if target in kwargs:
                kwargs[target]['collate_fn'] = collator
    optimizers = args.pop('optimizers', None)
    if optimizers is not None and optimizers[0] is not None:
        kwargs['optimizer'] = optimizers[0]
        if len(optimizers) > 1 and optimizers[1] is not None:
            kwargs['lr_config'] = dict(type='TorchSchedulerHook', scheduler=optimizers[1],
                                       by_epoch=kwargs.get('lr_config', {}).get('by_epoch', True))
    callbacks = args.pop('callbacks', None)
    if callbacks:
        kwargs['custom_hooks'] = list(kwargs.get('custom_hooks', [])) + list(callbacks)
    kwargs.update(args)
    return kwargs
