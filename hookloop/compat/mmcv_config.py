"""MMCV 1.x config keys, translated onto the Trainer's arguments before it is built.

A config written for mmdet 2.x / mmseg 0.x / mmcls 0.x loads unchanged: ``runner``,
``total_epochs``, ``workflow``, ``dist_params``, ``data``, ``fp16``, ``auto_scale_lr``,
``evaluation.metric``, ``custom_imports=dict(imports=...)``, top-level ``train_cfg`` /
``test_cfg`` and the process settings (``cudnn_benchmark``, ``mp_start_method``,
``opencv_num_threads``, ``gpu_ids``) mean what they mean in MMCV (docs/migration.md has the
table). Names the trainer does not know are helper variables (``dataset_type``,
``img_norm_cfg``, ``train_pipeline``...) unless they are a small edit away from a known key
(``lr_confg``): those are errors with a "did you mean". All problems are reported at once.
"""
import importlib
import inspect
import os
from collections.abc import Mapping

import torch

from ..engine.runner_names import EVAL_HOOK_KEYS as _EVAL_HOOK_KEYS
from ..engine.runner_names import MMCV_KEYS, needs_translation  # the keys this module consumes
from ..errors import ConfigError

_DATA_KEYS = ('samples_per_gpu', 'workers_per_gpu', 'train', 'val', 'test', 'persistent_workers', 'shuffle',
              'pin_memory', 'drop_last', 'train_dataloader', 'val_dataloader', 'test_dataloader')
_LOADER_OPTIONS = ('samples_per_gpu', 'workers_per_gpu', 'persistent_workers', 'shuffle', 'pin_memory', 'drop_last')
# EvalHook / DistEvalHook arguments with no meaning here (results are gathered in memory).
_EVAL_IGNORED = ('gpu_collect', 'tmpdir', 'broadcast_bn_buffer', 'out_dir',
                 'file_client_args', 'pre_eval', 'efficient_test')


def edit_distance(a, b):
    """Levenshtein distance (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def likely_typo(name, known):
    """The known key ``name`` is a small edit away from (at most 2, and a quarter of its length), or None."""
    limit = min(2, max(1, len(name) // 4))
    best = min(known, key=lambda k: edit_distance(name, k))
    return best if edit_distance(name, best) <= limit else None


def trainer_arguments(target):
    """The keyword arguments ``target`` takes, following ``**kwargs`` up to the base classes
    (a Trainer subclass passes the Trainer's own arguments through)."""
    names = []
    for cls in getattr(target, '__mro__', [target]):
        init = vars(cls).get('__init__') if isinstance(cls, type) else cls
        if init is None:
            continue
        params = inspect.signature(init).parameters
        names += [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != 'self']
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            break
    return list(dict.fromkeys(names))


_BY_EPOCH_CONFIGS = ('lr_config', 'momentum_config', 'checkpoint_config', 'log_config')
# Config names that are a known argument one level down: ``lr = 0.1`` at the top is not a
# helper variable MMCV would ignore silently here, it is meant for the optimizer.
_OPTIMIZER_ARGUMENTS = ('lr', 'momentum', 'weight_decay', 'betas', 'eps', 'nesterov', 'amsgrad', 'dampening')


def misplaced_argument(name, value, optimizer=None):
    """The error for a top-level ``name`` that is an optimizer argument (``lr = 0.1``) the
    optimizer config does not use with that value, or None. Only numbers count (a helper
    ``lr = 0.01`` that ``optimizer=dict(lr=lr)`` uses is fine)."""
    if name not in _OPTIMIZER_ARGUMENTS or isinstance(value, (Mapping, str)) or callable(value):
        return None
    configs = [optimizer] if isinstance(optimizer, Mapping) and 'type' in optimizer else \
        list(optimizer.values()) if isinstance(optimizer, Mapping) else []
    if any(isinstance(c, Mapping) and c.get(name) == value for c in configs):
        return None
    return (f'{name} = {value!r} at the top of the config is not used (MMCV would ignore it as a helper variable): '
            f'it is an optimizer argument; did you mean optimizer=dict(..., {name}={value!r})?')


def iter_based_defaults(lr_config=None, momentum_config=None, checkpoint_config=None, log_config=None):
    """MMCV's ``IterBasedRunner.register_training_hooks``: the LR, momentum, checkpoint and
    logger hooks count in iterations (``by_epoch=False``) unless their config says otherwise.
    Returns the four configs (copies; a Hook instance or None as given)."""
    def per_iteration(cfg):
        return {'by_epoch': False, **cfg} if isinstance(cfg, Mapping) else cfg
    if isinstance(log_config, Mapping) and 'hooks' in log_config:
        log_config = {**log_config, 'hooks': [per_iteration(h) for h in log_config['hooks']]}
    elif isinstance(log_config, Mapping):
        log_config = {**log_config, 'hooks': [dict(type='TextLoggerHook', by_epoch=False)]}
    return dict(lr_config=per_iteration(lr_config), momentum_config=per_iteration(momentum_config),
                checkpoint_config=per_iteration(checkpoint_config), log_config=log_config)


def is_mmcv_run(cfg):
    """True when ``cfg`` has a key only MMCV 1.x configs have (``runner``, ``data``, ``workflow``,
    ``total_epochs``, ...): the run is an MMCV run, built as MMCV's train scripts build it
    (the model wrapped, the optimizer over all parameters, MMCV's runner methods)."""
    return any(key in cfg for key in MMCV_KEYS)


def is_mmcv_config(cfg):
    """True when ``cfg`` has MMCV 1.x keys or MMCV's hook configs (``lr_config``, ...): then a
    top-level ``train`` is a helper variable (mmocr's dataset dicts), not a ModelScope section."""
    return any(key in cfg for key in MMCV_KEYS + _BY_EPOCH_CONFIGS + ('optimizer_config', 'optimizers'))


def translate(cfg, target, build_data=True):
    """``(kwargs for target, notes)``: ``cfg`` with the MMCV keys turned into ``target``'s
    arguments and the helper names removed; ``notes`` are lines to log at start. Raises one
    ConfigError listing every problem found. ``build_data=False`` (``hookloop hooks``) leaves
    the val dataset unbuilt, and so no ``dataset.evaluate`` evaluator."""
    known = trainer_arguments(target)
    mmcv_run = is_mmcv_run(cfg)
    cfg, problems, notes = dict(cfg), [], []
    _import_custom(cfg, problems, notes)
    _run_length(cfg, problems, notes)
    _optimizers(cfg, problems)
    _unknown_types(cfg, problems, build_data)
    iter_based = cfg.pop('_iter_based', False)
    _process_settings(cfg, problems, notes)
    _data(cfg, problems)
    _fp16(cfg, problems)
    _several_optimizers(cfg, problems, notes)
    _auto_scale_lr(cfg, problems, notes)
    _model_cfgs(cfg)
    _workflow(cfg, problems, notes, iter_based)
    _evaluation(cfg, problems, notes, iter_based, build_data, mmcv_run)
    if iter_based:
        for key, value in iter_based_defaults(**{k: cfg.get(k) for k in _BY_EPOCH_CONFIGS}).items():
            if value is not None:
                cfg[key] = value
    if mmcv_run:
        _as_mmcv_builds(cfg)
        if 'iter_based_runner' in known:
            cfg['iter_based_runner'] = iter_based
    helpers = []
    for name in list(cfg):
        if name in known:
            continue
        typo = likely_typo(name, list(known) + list(MMCV_KEYS))
        misplaced = misplaced_argument(name, cfg[name], cfg.get('optimizer'))
        if typo is not None:
            problems.append(f'{target.__name__} got an unexpected argument {name!r}; did you mean {typo!r}?')
        elif misplaced is not None:
            problems.append(misplaced)
        else:
            helpers.append(name)
        del cfg[name]
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f'the config has {len(problems)} problems:\n  - ' + '\n  - '.join(problems))
    if helpers:
        notes.append(f'config names not used by the trainer (helper variables, as MMCV allows): {", ".join(helpers)}')
    return cfg, notes


def _as_mmcv_builds(cfg):
    """The model and optimizer as the OpenMMLab train scripts build them: the model inside
    ``MMDataParallel`` (hooks reach ``runner.model.module``), and a plain optimizer dict through
    MMCV's ``DefaultOptimizerConstructor``, over all the parameters, frozen ones included (a hook
    that unfreezes layers later trains them, as in MMCV)."""
    from .mmcv.parallel import MMDataParallel, build_wrapped_model, is_module_wrapper
    model = cfg.get('model')
    if isinstance(model, torch.nn.Module) and not is_module_wrapper(model):
        cfg['model'] = MMDataParallel(model)
    elif isinstance(model, Mapping):
        cfg['model'] = dict(type=build_wrapped_model, cfg=model)  # built by the trainer, after seeding
    optimizer = cfg.get('optimizer')
    if isinstance(optimizer, Mapping) and 'type' in optimizer and \
            not {'constructor', 'paramwise_cfg', 'paramwise_options'} & set(optimizer):
        cfg['optimizer'] = {**optimizer, 'constructor': 'DefaultOptimizerConstructor'}


def _unknown_types(cfg, problems, build_data=True):
    """Every ``type`` (and LR / momentum ``policy``) of the config that names nothing registered,
    all in the one error (a config with an unknown optimizer, policy and hook says all three).
    ``build_data=False`` (``hookloop hooks``, which builds neither): the hooks' types only."""
    from ..engine.hook_list import policy_hook_cfg
    from ..optim.constructor import OPTIMIZER_CONSTRUCTORS, is_optimizer_dict_cfg
    from ..registry import DATASETS, HOOKS, MODELS, OPTIMIZERS
    imports = cfg.get('custom_imports')
    for module in [imports] if isinstance(imports, str) else imports if isinstance(imports, (list, tuple)) else []:
        # the list form is the Trainer's, which reports a bad entry; what it registers counts here
        if not isinstance(module, str):
            return
        try:
            importlib.import_module(module)
        except (ImportError, ValueError):
            return

    def check(registry, spec, where):
        kind = spec.get('type') if isinstance(spec, Mapping) else None
        if isinstance(kind, str):
            try:
                registry.get(kind)
            except ConfigError as exc:
                problems.append(f'{where}: {exc}')

    if build_data:
        check(MODELS, cfg.get('model'), 'model')
    optimizer = cfg.get('optimizer')
    for name, spec in optimizer.items() if is_optimizer_dict_cfg(optimizer) else [(None, optimizer)]:
        where = 'optimizer' if name is None else f'optimizer.{name}'
        check(OPTIMIZERS, spec, where)
        if isinstance(spec, Mapping) and isinstance(spec.get('constructor'), str):
            check(OPTIMIZER_CONSTRUCTORS, dict(type=spec['constructor']), f'{where}.constructor')
    for key, suffix in (('lr_config', 'LrUpdaterHook'), ('momentum_config', 'MomentumUpdaterHook')):
        if isinstance(cfg.get(key), Mapping):
            try:
                check(HOOKS, policy_hook_cfg(cfg[key], suffix), key)
            except ConfigError as exc:
                problems.append(f'{key}: {exc}')
    for key in ('optimizer_config', 'checkpoint_config', 'timer_config', 'evaluation'):
        check(HOOKS, cfg.get(key), key)
    log_config = cfg.get('log_config')
    for index, hook in enumerate(log_config.get('hooks') or [] if isinstance(log_config, Mapping) else []):
        check(HOOKS, hook, f'log_config.hooks[{index}]')
    custom = cfg.get('custom_hooks')
    for index, hook in enumerate([custom] if isinstance(custom, Mapping) else custom or []):
        check(HOOKS, hook, f'custom_hooks[{index}]')
    data = cfg.get('data')
    for split in ('train', 'val') if build_data else ():
        if isinstance(data, Mapping):
            for spec in data.get(split) if isinstance(data.get(split), (list, tuple)) else [data.get(split)]:
                check(DATASETS, spec, f'data.{split}')
        loader = cfg.get(f'{split}_dataloader')
        if isinstance(loader, Mapping):
            check(DATASETS, loader.get('dataset'), f'{split}_dataloader.dataset')


def _import_custom(cfg, problems, notes):
    spec = cfg.get('custom_imports')
    if not isinstance(spec, Mapping):
        return
    spec = dict(spec)
    imports = spec.pop('imports', [])
    allow_failed = spec.pop('allow_failed_imports', False)
    if spec:
        problems.append(f'custom_imports got unknown keys {sorted(spec)}; use imports and allow_failed_imports')
    imported = []
    for module in [imports] if isinstance(imports, str) else imports:
        try:
            importlib.import_module(module)
            imported.append(module)
        except ImportError as exc:
            if not allow_failed:
                problems.append(f'custom_imports: cannot import {module!r}: {exc}')
            else:
                notes.append(f'custom_imports: {module!r} failed to import and is skipped: {exc}')
    cfg['custom_imports'] = imported


_RUNNER_LENGTHS = {'EpochBasedRunner': 'max_epochs', 'IterBasedRunner': 'max_iters',
                   'DynamicIterBasedRunner': 'max_iters'}  # mmgeneration's; dynamic DDP is not needed here
_RUNNER_IGNORED = {'DynamicIterBasedRunner': ('is_dynamic_ddp', 'pass_training_status', 'fp16_loss_scaler',
                                              'use_apex_amp')}


def _run_length(cfg, problems, notes):
    runner, total_epochs = cfg.pop('runner', None), cfg.pop('total_epochs', None)
    total_iters = cfg.pop('total_iters', None)  # mmediting: IterBasedRunner(max_iters=total_iters)
    if runner is None:
        if total_epochs is not None:
            runner = dict(type='EpochBasedRunner', max_epochs=total_epochs)
        elif total_iters is not None:
            runner = dict(type='IterBasedRunner', max_iters=total_iters)
        else:
            return
    if not isinstance(runner, Mapping):
        problems.append(f"runner must be a dict like dict(type='EpochBasedRunner', max_epochs=12), got {runner!r}")
        return
    runner = dict(runner)
    kind = runner.pop('type', 'EpochBasedRunner')
    length_key = _RUNNER_LENGTHS.get(kind)
    if length_key is None:
        problems.append(f"runner type {kind!r} is not supported; use one of {', '.join(_RUNNER_LENGTHS)}")
        return
    value = runner.pop(length_key, None)
    if value is None and length_key == 'max_iters':
        value = total_iters
    for key in _RUNNER_IGNORED.get(kind, ()):
        if runner.pop(key, None) is not None:
            notes.append(f'runner ({kind}) {key} has no effect here')
    if runner:
        problems.append(f'runner ({kind}) got unexpected keys {sorted(runner)}; it takes {length_key}')
    if value is None:
        problems.append(f'runner ({kind}) needs {length_key}')
        return
    if total_epochs is not None and length_key == 'max_epochs' and total_epochs != value:
        problems.append(f'total_epochs={total_epochs} and runner.max_epochs={value} disagree')
    for key in ('max_epochs', 'max_iters'):
        # With a runner, a top-level max_epochs is a helper variable (YOLOX: max_epochs = 300,
        # runner=dict(max_epochs=max_epochs)): MMCV reads only the runner's, so --cfg-options
        # runner.max_epochs=N decides.
        if cfg.get(key) is not None and (key != length_key or cfg[key] != value):
            notes.append(f'{key}={cfg[key]!r} is a helper variable here: runner=dict(type={kind!r}, '
                         f'{length_key}={value!r}) sets the run length (as in MMCV)')
        cfg.pop(key, None)
    cfg[length_key] = value
    cfg['_iter_based'] = kind != 'EpochBasedRunner'


def _optimizers(cfg, problems):
    # mmediting / mmgeneration: optimizers=dict(generator=dict(...), discriminator=dict(...))
    if 'optimizers' not in cfg:
        return
    if cfg.get('optimizer') is not None:
        problems.append('optimizer and optimizers both describe the optimizers; keep one')
        return
    cfg['optimizer'] = cfg.pop('optimizers')


def _process_settings(cfg, problems, notes):
    dist_params = cfg.pop('dist_params', None)
    if dist_params is not None:
        if not isinstance(dist_params, Mapping):
            problems.append(f"dist_params must be a dict like dict(backend='nccl'), got {dist_params!r}")
        else:
            backend = dist_params.get('backend')
            if backend == 'nccl' and not torch.cuda.is_available():
                notes.append("dist_params backend 'nccl' needs CUDA; this machine has none, so gloo is used")
            elif backend is not None and cfg.get('dist_backend') is None:
                cfg['dist_backend'] = backend
            unused = sorted(set(dist_params) - {'backend'})
            if unused:
                notes.append(f'dist_params {unused} are not used: torchrun sets the address and port')
    if cfg.pop('gpu_ids', None) is not None:
        notes.append('gpu_ids is not used: the device comes from device=/torchrun (one GPU per process)')
    if 'cudnn_benchmark' in cfg:
        torch.backends.cudnn.benchmark = bool(cfg.pop('cudnn_benchmark'))
    method = cfg.pop('mp_start_method', None)
    if method is not None:
        import multiprocessing
        if method not in multiprocessing.get_all_start_methods():
            problems.append(f'mp_start_method {method!r} is not available here: {multiprocessing.get_all_start_methods()}')
        else:
            multiprocessing.set_start_method(method, force=True)  # as MMCV's setup_multi_processes
    threads = cfg.pop('opencv_num_threads', None)
    if threads is not None:
        try:
            import cv2
            cv2.setNumThreads(threads)
        except ImportError:
            pass  # no OpenCV: nothing to limit


def _loader(dataset, options, shuffle):
    workers = options.get('workers_per_gpu', 0)
    loader = dict(dataset=dataset, batch_size=options.get('samples_per_gpu', 1), num_workers=workers,
                  shuffle=options.get('shuffle', shuffle))
    for key in ('pin_memory', 'drop_last'):
        if key in options:
            loader[key] = options[key]
    if workers > 0 and options.get('persistent_workers'):  # torch refuses it without workers
        loader['persistent_workers'] = True
    return loader


def _samples_spelling(options):
    # mmaction2 0.x: videos_per_gpu is samples_per_gpu
    if 'videos_per_gpu' in options:
        options.setdefault('samples_per_gpu', options.pop('videos_per_gpu'))
    return options


def _data(cfg, problems):
    data = cfg.pop('data', None)
    if data is None:
        return
    if not isinstance(data, Mapping):
        problems.append(f'data must be a dict like dict(samples_per_gpu=2, workers_per_gpu=2, train=...), got {data!r}')
        return
    data = _samples_spelling(dict(data))
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if isinstance(data.get(key), Mapping):
            data[key] = _samples_spelling(dict(data[key]))
    unknown = sorted(set(data) - set(_DATA_KEYS))
    if unknown:
        problems.append(f'data got unknown keys {unknown}; known: {", ".join(_DATA_KEYS)}')
    common = {k: data[k] for k in _LOADER_OPTIONS if k in data}
    for split, shuffle, target in (('train', True, 'train_dataloader'), ('val', False, 'val_dataloader')):
        dataset = data.get(split)
        if dataset is None:
            continue
        if cfg.get(target) is not None:
            problems.append(f'data.{split} and {target} both describe the {split} loader; keep one')
            continue
        options = dict(common)
        if split == 'val':
            options['samples_per_gpu'] = 1  # MMCV's test loaders default to one sample per GPU
            options['shuffle'] = False
            if isinstance(dataset, Mapping) and 'samples_per_gpu' in dataset:
                dataset = dict(dataset)
                options['samples_per_gpu'] = dataset.pop('samples_per_gpu')
        options.update(data.get(f'{split}_dataloader') or {})
        if isinstance(dataset, (list, tuple)):  # MMCV concatenates a list of datasets
            from torch.utils.data import ConcatDataset

            from ..engine.builder import build_dataset
            dataset = ConcatDataset([build_dataset(d) for d in dataset])
        cfg[target] = _loader(dataset, options, shuffle)
        if split == 'val':
            cfg['_val_from_data'] = True
    cfg['_samples_per_gpu'] = data.get('samples_per_gpu')


def _fp16(cfg, problems):
    fp16 = cfg.pop('fp16', None)
    if fp16 is None:
        return
    if not isinstance(fp16, Mapping):
        problems.append(f"fp16 must be a dict like dict(loss_scale=512.) or dict(loss_scale='dynamic'), got {fp16!r}")
        return
    optimizer_config = dict(cfg.get('optimizer_config') or {})
    if optimizer_config.get('type', 'OptimizerHook') in ('OptimizerHook', 'GradientCumulativeOptimizerHook'):
        optimizer_config['precision'] = 'fp16'
    # mmdet's train_detector: Fp16OptimizerHook(**optimizer_config, **fp16)
    optimizer_config.update(fp16)
    cfg['optimizer_config'] = optimizer_config


_OPTIMIZER_HOOK_DEFAULTS = dict(type='OptimizerHook', grad_clip=None, cumulative_iters=1,
                                detect_anomalous_params=False)


def _several_optimizers(cfg, problems, notes):
    """Several optimizers and a model with ``train_step``: the model steps them (MMCV's GAN
    contract), so an ``optimizer_config`` has nothing to step (mmhuman3d's HMR configs set
    ``dict(grad_clip=None)``; MMCV's OptimizerHook fails on the dict of optimizers). One with
    only default values is dropped with a note; one that asks for something is an error."""
    from ..optim.constructor import is_optimizer_dict_cfg
    from ..registry import MODELS
    optimizer, hook_cfg = cfg.get('optimizer'), cfg.get('optimizer_config')
    if not is_optimizer_dict_cfg(optimizer) or not isinstance(hook_cfg, Mapping):
        return
    model = cfg.get('model')
    kind = model if isinstance(model, torch.nn.Module) else \
        MODELS.module_dict.get(model.get('type')) if isinstance(model, Mapping) else None
    if not callable(getattr(kind, 'train_step', None)):
        return  # a plain model: the optimizer hook steps every optimizer of the dict
    names = ', '.join(optimizer)
    asked = {key: value for key, value in hook_cfg.items() if _OPTIMIZER_HOOK_DEFAULTS.get(key, object()) != value}
    if asked:
        problems.append(f'optimizer_config {asked} cannot apply: the model\'s train_step steps its several optimizers '
                        f'({names}) itself, so no optimizer hook runs (MMCV\'s OptimizerHook fails on a dict of '
                        'optimizers too); do it in train_step, or use one optimizer')
        return
    notes.append(f'optimizer_config={dict(hook_cfg)} is not used: the model\'s train_step steps its several optimizers '
                 f'({names}) itself (MMCV\'s OptimizerHook would fail on a dict of optimizers)')
    del cfg['optimizer_config']


def _auto_scale_lr(cfg, problems, notes):
    samples_per_gpu = cfg.pop('_samples_per_gpu', None)
    spec = cfg.pop('auto_scale_lr', None)
    if not spec or not spec.get('enable', False):
        return
    base = spec.get('base_batch_size')
    if not base or samples_per_gpu is None:
        problems.append('auto_scale_lr needs base_batch_size and data.samples_per_gpu')
        return
    world_size = int(os.environ.get('WORLD_SIZE', 1))
    factor = world_size * samples_per_gpu / base
    optimizer = cfg.get('optimizer')
    configs = optimizer.values() if isinstance(optimizer, Mapping) and 'type' not in optimizer else [optimizer]
    for opt in configs:
        if isinstance(opt, Mapping) and 'lr' in opt:
            opt['lr'] = opt['lr'] * factor
    notes.append(f'auto_scale_lr: batch {world_size} x {samples_per_gpu} vs base {base}: LR scaled by {factor:g}')


def _model_cfgs(cfg):
    # mmdet 2.x's older configs keep train_cfg / test_cfg beside the model; build_detector passes them in.
    for key in ('train_cfg', 'test_cfg'):
        value = cfg.pop(key, None)
        if value is not None and isinstance(cfg.get('model'), Mapping):
            cfg['model'] = {**cfg['model'], key: cfg['model'].get(key, value)}


def _workflow(cfg, problems, notes, iter_based):
    workflow = cfg.pop('workflow', None)
    if workflow is None:
        return
    try:
        phases = [(str(mode), int(count)) for mode, count in workflow]
    except (TypeError, ValueError):
        problems.append(f"workflow must be a list like [('train', 1)] or [('train', 1), ('val', 1)], got {workflow!r}")
        return
    modes = [mode for mode, _ in phases]
    if not modes or modes[0] != 'train' or set(modes) - {'train', 'val'} or modes.count('train') > 1:
        problems.append(f"workflow {workflow!r}: hookloop runs [('train', n)] optionally followed by ('val', k)")
        return
    if 'val' in modes and cfg.get('evaluation') is None:
        # ('val', k) after ('train', n): validate every n epochs (iterations for IterBasedRunner)
        cfg['evaluation'] = dict(interval=phases[0][1], by_epoch=not iter_based)
        if cfg.get('val_dataloader') is None:
            problems.append("workflow has ('val', k) but there is no val data (data.val or val_dataloader)")


def _evaluation(cfg, problems, notes, iter_based, build_data=True, mmcv_run=False):
    evaluation = cfg.get('evaluation')
    from_data = cfg.pop('_val_from_data', False)
    if evaluation is None and from_data and mmcv_run:
        # The OpenMMLab train scripts validate with EvalHook(**cfg.get('evaluation', {})): the
        # val dataset's evaluate() every epoch (every interval of iterations), also without the key.
        evaluation = {}
    if not isinstance(evaluation, Mapping):
        return
    evaluation = dict(evaluation)
    if iter_based:
        evaluation.setdefault('by_epoch', False)  # as mmdet / mmseg set it for IterBasedRunner
    ignored = [k for k in _EVAL_IGNORED if evaluation.pop(k, None) is not None]
    if ignored:
        notes.append(f'evaluation {ignored} have no effect here (results are gathered in memory)')
    eval_kwargs = {k: evaluation.pop(k) for k in list(evaluation) if k not in _EVAL_HOOK_KEYS}
    cfg['evaluation'] = evaluation
    dataset_evaluates = from_data and mmcv_run and cfg.get('val_evaluator') is None
    if not eval_kwargs and not dataset_evaluates:
        return
    if cfg.get('val_evaluator') is not None:
        problems.append(f'evaluation has dataset options {sorted(eval_kwargs)} and val_evaluator is set; keep one')
        return
    loader = cfg.get('val_dataloader')
    if not isinstance(loader, Mapping) or loader.get('dataset') is None:
        problems.append(f'evaluation has {sorted(eval_kwargs)} for the val dataset, but there is no val data')
        return
    if not build_data:
        return
    from ..engine.builder import build_dataset
    from .dataset_evaluator import DatasetEvaluator
    try:
        dataset = build_dataset(loader['dataset'])  # built once: the loader and the evaluator share it
        cfg['val_dataloader'] = {**loader, 'dataset': dataset}
        if not eval_kwargs and not callable(getattr(dataset, 'evaluate', None)):
            notes.append(f'data.val: {type(dataset).__name__} has no evaluate(results, ...) for MMCV\'s EvalHook; '
                         'validation logs the model\'s own outputs')
            return
        cfg['val_evaluator'] = DatasetEvaluator(dataset, **eval_kwargs)
    except ConfigError as exc:
        problems.append(str(exc))
